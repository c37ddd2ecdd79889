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

TABLE = "cohorts_consentchange"
INDEX = "cohorts_consentchange_tenant_id_c3443e4a"  # the name Django gives the foreign key's index


def _concurrently(schema_editor) -> str:  # type: ignore[no-untyped-def]
    return " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TABLE)
        for name, constraint in constraints.items():
            if constraint["index"] and not constraint["unique"] and constraint["columns"] == ["tenant_id"]:
                cursor.execute(f"DROP INDEX{_concurrently(schema_editor)} IF EXISTS {connection.ops.quote_name(name)}")


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    with schema_editor.connection.cursor() as cursor:
        if schema_editor.connection.vendor == "postgresql":
            cursor.execute(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
                [INDEX],
            )
            row = cursor.fetchone()
            if row is not None and not row[0]:
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
        cursor.execute(f"CREATE INDEX{_concurrently(schema_editor)} IF NOT EXISTS {INDEX} ON {TABLE} (tenant_id)")


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
