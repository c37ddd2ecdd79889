from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("interactions", "0007_feedback_partial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="feedback",
            name="kept_text",
            field=models.TextField(
                blank=True,
                help_text="for 'edited': what the user kept; for 'edit_persisted' (optional): the code still in the file",
            ),
        ),
    ]
