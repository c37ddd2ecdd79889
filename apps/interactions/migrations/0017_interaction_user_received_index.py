"""An end user's interactions newest first, served by one index: ``(tenant, end_user_id,
received_at)`` replaces ``(tenant, end_user_id)``, which it leads with, so every lookup by user (the
erase, the API's filter, the counts) keeps its index.

The dashboard's end-user page reads a user's 20 latest interactions. With only the old index,
Postgres walked the tenant's ``(tenant, received_at)`` index backwards, filtering by user, and for a
user with few interactions that is most of the tenant: 4.0 s for one user of a 5,000,000-row tenant
(``make bench-data`` at 10,000,000 interactions). The new index gives the 20 at once.

On Postgres the new index is built and the old one dropped ``CONCURRENTLY`` (a non-atomic migration,
as cohorts.0005 and 0006): ingest goes on while a big table is indexed. Other databases (the
embedded SQLite) change them plainly.
"""

from django.db import migrations, models

from apps.common.migration_indexes import index_build

OLD = models.Index(fields=["tenant", "end_user_id"], name="interaction_tenant__27459e_idx")
NEW = models.Index(fields=["tenant", "end_user_id", "received_at"], name="interaction_tenant_user_recv")
TABLE = "interactions_interaction"


def _swap(schema_editor, model, *, build: models.Index, drop: models.Index, columns: str) -> None:  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, build)
        schema_editor.remove_index(model, drop)
        return
    index_build(schema_editor, name=build.name, on=f"{TABLE} ({columns})")
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {drop.name}")


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    model = apps.get_model("interactions", "Interaction")
    _swap(schema_editor, model, build=NEW, drop=OLD, columns="tenant_id, end_user_id, received_at")


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    model = apps.get_model("interactions", "Interaction")
    _swap(schema_editor, model, build=OLD, drop=NEW, columns="tenant_id, end_user_id")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("interactions", "0016_packed_token_columns")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="interaction", name=OLD.name),
                migrations.AddIndex(model_name="interaction", index=NEW),
            ],
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
        )
    ]
