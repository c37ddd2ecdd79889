"""The consent history's own ``end_user`` index goes, as 0006 dropped its ``tenant`` one: the
``(end_user, changed_at)`` index leads with the same column, so it serves every lookup by end user
alone (a user's history, an erase), and the single-column one only cost space and a second write per
consent change. Dropped ``CONCURRENTLY`` on Postgres (``apps.common.migration_indexes``); reversed,
built again the same way."""

import django.db.models.deletion
from django.db import migrations, models

from apps.common.migration_indexes import index_build, index_drop_single_column

TABLE = "cohorts_consentchange"
INDEX = "cohorts_consentchange_end_user_id_76ac85e6"  # the name Django gives the foreign key's index


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    index_drop_single_column(schema_editor, table=TABLE, column="end_user_id")


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    index_build(schema_editor, name=INDEX, on=f"{TABLE} (end_user_id)")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("cohorts", "0006_consent_change_tenant_index_in_the_tenant_changed_at_one"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="consentchange",
                    name="end_user",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="consent_history",
                        to="cohorts.enduser",
                    ),
                )
            ],
            database_operations=[migrations.RunPython(drop, create, elidable=False)],
        )
    ]
