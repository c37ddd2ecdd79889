"""The consent history's own ``tenant`` index goes: the ``(tenant, changed_at)`` index of 0005 leads
with the same column, so it serves every lookup by tenant alone (the chart's, a tenant's deletion),
and the single-column one only cost space and a second write per consent change.

Dropping an index on Postgres takes a lock that stops every read and write of the table until it
commits, so there it is dropped ``CONCURRENTLY`` (hence a non-atomic migration, as 0005). The index
is found by its columns, not by the name Django gave it; an interrupted drop leaves an invalid index,
which running ``migrate`` again drops. Other databases (the embedded SQLite) drop it plainly.
Reversed, it is built again the same way.
"""

import django.db.models.deletion
from django.db import migrations, models

from apps.common.migration_indexes import index_build, index_drop_single_column

TABLE = "cohorts_consentchange"
INDEX = "cohorts_consentchange_tenant_id_c3443e4a"  # the name Django gives the foreign key's index


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    index_drop_single_column(schema_editor, table=TABLE, column="tenant_id")


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    index_build(schema_editor, name=INDEX, on=f"{TABLE} (tenant_id)")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("cohorts", "0005_consent_change_tenant_changed_at_index"),
        ("tenants", "0005_retention_days"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="consentchange",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="tenants.tenant",
                    ),
                )
            ],
            database_operations=[migrations.RunPython(drop, create, elidable=False)],
        )
    ]
