# ServingFailure now belongs to the interactions app (its 0006): state only, the table stays.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('interactions', '0006_servingfailure_moved'),
        ('serving', '0002_servingfailure_experiment'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='ServingFailure')],
            database_operations=[],
        ),
    ]
