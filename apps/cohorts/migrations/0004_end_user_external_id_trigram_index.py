"""Finding an end user by any part of their id, served by an index on Postgres.

The dashboard's and the API's search is ``external_id__icontains``, which Postgres runs as
``UPPER(external_id) LIKE UPPER('%part%')``: no btree serves that, so a tenant with a million end
users read every one of them per search. A trigram (``pg_trgm``) GIN index on the same expression
does. It is built ``CONCURRENTLY`` (hence a non-atomic migration): writes to end users go on while
a big table is indexed. A build that failed half-way leaves an invalid index behind, which is
dropped and built again; the table is analysed after. Other databases (the embedded SQLite) keep their plain scan.
"""

import sys

from django.db import migrations
from django.db.utils import DatabaseError

from apps.common.migration_indexes import index_build

INDEX = "cohorts_enduser_external_id_trgm"


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
        if cursor.fetchone() is None:
            try:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            except DatabaseError as exc:  # a managed database's user may not create extensions
                # The migration runs in autocommit (non-atomic): the connection stays usable, and the
                # deploy goes on with search unindexed (right, only slower on a big tenant).
                print(
                    f"\n  cohorts.0004: pg_trgm could not be created ({str(exc).strip()}); end-user search "
                    "stays unindexed. As a database admin run `CREATE EXTENSION pg_trgm;`, then "
                    "`manage.py migrate cohorts 0003 && manage.py migrate cohorts` (docs/deploy.md).",
                    file=sys.stderr,
                )
                return
        index_build(schema_editor, name=INDEX, on="cohorts_enduser USING gin (UPPER(external_id::text) gin_trgm_ops)")
        # The planner knows an expression's values only once the table is analysed: until then it
        # guessed that a search matches 0.5 % of the users and walked the tenant's ids instead.
        cursor.execute("ANALYZE cohorts_enduser")


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("cohorts", "0003_end_user_tenant_index_in_the_unique_one")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
