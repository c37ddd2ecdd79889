"""A training window walks the tenant's events oldest first by (tenant, id): that index replaces the
foreign key's index on tenant alone, which it leads with."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("interactions", "0013_mark_existing_hours"),
        ("tenants", "0005_retention_days"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="feedback",
            index=models.Index(fields=["tenant", "id"], name="feedback_tenant_id"),
        ),
        migrations.AlterField(
            model_name="feedback",
            name="tenant",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="+", to="tenants.tenant"
            ),
        ),
    ]
