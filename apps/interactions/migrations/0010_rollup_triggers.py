"""Triggers that mark the hours whose rollups a change touched (``RollupDirty``), on every write to
interactions and feedback, whichever code path makes it (ingest, serving, pending feedback attached,
session outcomes spread, erase). Postgres: statement-level with transition tables, one insert per
statement. SQLite (the embedded default): row-level."""

from django.db import migrations

_PG_FUNCTIONS = """
CREATE OR REPLACE FUNCTION strop_rollup_mark_interactions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO interactions_rollupdirty (tenant_id, hour)
    SELECT DISTINCT tenant_id, date_trunc('hour', served_at, 'UTC') FROM changed;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION strop_rollup_mark_feedback() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO interactions_rollupdirty (tenant_id, hour)
    SELECT DISTINCT i.tenant_id, date_trunc('hour', i.served_at, 'UTC')
    FROM changed f JOIN interactions_interaction i ON i.id = f.interaction_id;
    RETURN NULL;
END $$;
"""
_TABLES = (("interactions_interaction", "interactions"), ("interactions_feedback", "feedback"))
_EVENTS = (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD"))


def _pg_forward() -> str:
    sql = [_PG_FUNCTIONS]
    for table, kind in _TABLES:
        for event, which in _EVENTS:
            sql.append(
                f"CREATE TRIGGER strop_rollup_{kind}_{event.lower()} AFTER {event} ON {table} "
                f"REFERENCING {which} TABLE AS changed FOR EACH STATEMENT "
                f"EXECUTE FUNCTION strop_rollup_mark_{kind}();"
            )
    return "\n".join(sql)


def _sqlite_forward() -> list[str]:
    hour = "strftime('%Y-%m-%d %H:00:00', {row}.served_at)"
    sql = []
    for event, which in _EVENTS:
        sql.append(
            f"CREATE TRIGGER strop_rollup_interactions_{event.lower()} AFTER {event} ON interactions_interaction "
            f"BEGIN INSERT INTO interactions_rollupdirty (tenant_id, hour) "
            f"VALUES ({which}.tenant_id, {hour.format(row=which)}); END;"
        )
        sql.append(
            f"CREATE TRIGGER strop_rollup_feedback_{event.lower()} AFTER {event} ON interactions_feedback "
            f"BEGIN INSERT INTO interactions_rollupdirty (tenant_id, hour) "
            f"SELECT i.tenant_id, {hour.format(row='i')} FROM interactions_interaction i "
            f"WHERE i.id = {which}.interaction_id; END;"
        )
    return sql


def _drop() -> list[str]:
    return [
        f"DROP TRIGGER IF EXISTS strop_rollup_{kind}_{event.lower()}" for _, kind in _TABLES for event, _ in _EVENTS
    ]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_pg_forward())
    else:
        for statement in _sqlite_forward():
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    postgres = schema_editor.connection.vendor == "postgresql"
    for statement, (table, _) in zip(_drop(), [t for t in _TABLES for _ in _EVENTS], strict=True):
        schema_editor.execute(statement + (f" ON {table}" if postgres else ""))
    if postgres:
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS strop_rollup_mark_interactions(); DROP FUNCTION IF EXISTS strop_rollup_mark_feedback();"
        )


class Migration(migrations.Migration):
    dependencies = [("interactions", "0009_rollups")]

    operations = [migrations.RunPython(forward, backward)]
