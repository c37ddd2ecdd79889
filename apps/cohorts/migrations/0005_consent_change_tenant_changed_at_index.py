"""The cohorts chart's last 30 days of consent changes, served by an index.

``optin_over_time`` (apps/dashboard/cohort_stats.py) filters a tenant's ``ConsentChange`` rows by
``changed_at``; the only index led with the end user, so each view of the page read every change
the tenant ever had. The history is append-only and grows with the tenant's users, so on Postgres
the ``(tenant, changed_at)`` index is built ``CONCURRENTLY`` (hence a non-atomic migration, as
0004): consent writes go on while a big history is indexed. A build that failed half-way leaves an
invalid index behind, which is dropped and built again. Other databases (the embedded SQLite)
create it the ordinary way.
"""

from django.db import migrations, models

from apps.common.migration_indexes import index_build

INDEX = models.Index(fields=["tenant", "changed_at"], name="cohorts_con_tenant__9e4109_idx")


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(apps.get_model("cohorts", "ConsentChange"), INDEX)
        return
    index_build(schema_editor, name=INDEX.name, on="cohorts_consentchange (tenant_id, changed_at)")


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(apps.get_model("cohorts", "ConsentChange"), INDEX)
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX.name}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("cohorts", "0004_end_user_external_id_trigram_index")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="consentchange", index=INDEX)],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        )
    ]
