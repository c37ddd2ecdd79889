"""Token ids and logprobs from ``jsonb`` to packed ``bytea`` (``apps.interactions.packed``).

On Postgres one ``ALTER TABLE`` rewrites the table, converting in SQL (``int4send`` and
``float8send`` write the packed format), under an exclusive lock on the interactions table: about
2,700 rows a second on a 2-core box, so plan it with the upgrade (docs/deploy.md, Upgrading). On
other databases (the embedded SQLite) ``AlterField`` remakes the table and the rows are converted
here, a thousand at a time; ``0010``'s rollup triggers are dropped for the remake and built again.

A logprobs list with a ``null`` in it (JSON's way of writing a ``-inf``) becomes an empty one on
either database: no behaviour logprobs, as the trainer already reads a list of the wrong length."""

import importlib

from django.db import migrations

import apps.interactions.packed

COLUMNS = {
    "prompt_token_ids": "ids",
    "completion_token_ids": "ids",
    "completion_logprobs": "floats",
}

PG_FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION pg_temp.strop_pack_ids(j jsonb) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN jsonb_typeof(j) IS DISTINCT FROM 'array' THEN NULL
    WHEN jsonb_array_length(j) = 0 THEN ''::bytea
    WHEN (SELECT max(e::int8) FROM jsonb_array_elements_text(j) AS t(e)) < 65536 THEN '\x02'::bytea || (
      SELECT string_agg(substring(int4send(e::int4) FROM 3 FOR 2), ''::bytea ORDER BY n)
      FROM jsonb_array_elements_text(j) WITH ORDINALITY AS t(e, n))
    ELSE '\x04'::bytea || (
      SELECT string_agg(int4send(e::int4), ''::bytea ORDER BY n)
      FROM jsonb_array_elements_text(j) WITH ORDINALITY AS t(e, n))
  END
$$;
CREATE OR REPLACE FUNCTION pg_temp.strop_pack_floats(j jsonb) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE
    WHEN jsonb_typeof(j) IS DISTINCT FROM 'array' THEN NULL
    WHEN EXISTS (SELECT 1 FROM jsonb_array_elements(j) AS t(e) WHERE jsonb_typeof(e) <> 'number') THEN ''::bytea
    ELSE coalesce((SELECT string_agg(float8send(e::float8), ''::bytea ORDER BY n)
                   FROM jsonb_array_elements_text(j) WITH ORDINALITY AS t(e, n)), ''::bytea)
  END
$$;
"""


def _convert_rows(schema_editor, table: str, convert) -> None:  # type: ignore[no-untyped-def]
    """Rewrite each row's three columns with ``convert(kind, value)``, a thousand rows a batch in
    id order (SQLite both ways; Postgres on the way back)."""
    columns = list(COLUMNS)
    assignments = ", ".join(f"{c} = %s" for c in columns)
    select = f"SELECT id, {', '.join(columns)} FROM {table}"
    last = None
    with schema_editor.connection.cursor() as cursor:
        while True:
            if last is None:
                cursor.execute(f"{select} ORDER BY id LIMIT 1000")
            else:
                cursor.execute(f"{select} WHERE id > %s ORDER BY id LIMIT 1000", [last])
            rows = cursor.fetchall()
            if not rows:
                return
            for pk, *values in rows:
                new = [convert(COLUMNS[c], v) for c, v in zip(columns, values, strict=True)]
                cursor.execute(f"UPDATE {table} SET {assignments} WHERE id = %s", [*new, pk])
            last = rows[-1][0]


def pack_postgres(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Postgres: the columns converted in SQL, before ``AlterField`` (which then changes nothing)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    table = apps.get_model("interactions", "Interaction")._meta.db_table
    using = ", ".join(
        f"ALTER COLUMN {column} TYPE bytea USING pg_temp.strop_pack_{kind}({column})"
        for column, kind in COLUMNS.items()
    )
    schema_editor.execute(PG_FUNCTIONS)
    schema_editor.execute(f"ALTER TABLE {table} {using}")
    schema_editor.execute("DROP FUNCTION pg_temp.strop_pack_ids(jsonb); DROP FUNCTION pg_temp.strop_pack_floats(jsonb)")


def pack_rows(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Other databases: ``AlterField`` remade the table with the JSON text copied; packed here."""
    import orjson

    from apps.interactions.packed import pack_floats, pack_ids

    if schema_editor.connection.vendor == "postgresql":
        return

    def convert(kind, value):  # type: ignore[no-untyped-def]
        if value is None or isinstance(value, (bytes, memoryview)):
            return value
        parsed = orjson.loads(value)
        if not isinstance(parsed, list):
            return None
        if kind == "ids":
            return pack_ids(parsed)
        return pack_floats([] if None in parsed else parsed)

    _convert_rows(schema_editor, apps.get_model("interactions", "Interaction")._meta.db_table, convert)


def unpack(apps, schema_editor):  # type: ignore[no-untyped-def]
    """The way back, before ``AlterField`` is undone: JSON again (Postgres: through hex text,
    converted here, then typed ``jsonb``; other databases: JSON text in the binary column). orjson
    writes a ``-inf`` as ``null``, as the writers before the packing did."""
    import orjson

    from apps.interactions.packed import unpack_floats, unpack_ids

    table = apps.get_model("interactions", "Interaction")._meta.db_table
    postgres = schema_editor.connection.vendor == "postgresql"

    def convert(kind, value):  # type: ignore[no-untyped-def]
        if value is None:
            return None
        raw = bytes.fromhex(value) if postgres else value
        return orjson.dumps(unpack_ids(raw) if kind == "ids" else unpack_floats(raw)).decode()

    if postgres:
        hexed = ", ".join(f"ALTER COLUMN {c} TYPE text USING encode({c}, 'hex')" for c in COLUMNS)
        schema_editor.execute(f"ALTER TABLE {table} {hexed}")
    _convert_rows(schema_editor, table, convert)
    if postgres:
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the updates' deferred checks, before ALTER
        typed = ", ".join(f"ALTER COLUMN {c} TYPE jsonb USING {c}::jsonb" for c in COLUMNS)
        schema_editor.execute(f"ALTER TABLE {table} {typed}")


def _rollup_triggers_sqlite(schema_editor, *, build: bool) -> None:  # type: ignore[no-untyped-def]
    """SQLite: ``AlterField`` remakes the interactions table, which drops its triggers with it and
    cannot rename the new table in while the feedback's triggers name the old one. So ``0010``'s
    triggers go before the remake and come back after it, either way."""
    if schema_editor.connection.vendor == "postgresql":
        return
    triggers = importlib.import_module("apps.interactions.migrations.0010_rollup_triggers")
    for statement in triggers._drop() + (triggers._sqlite_forward() if build else []):
        schema_editor.execute(statement)


def rollup_triggers_drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    _rollup_triggers_sqlite(schema_editor, build=False)


def rollup_triggers_build(apps, schema_editor):  # type: ignore[no-untyped-def]
    _rollup_triggers_sqlite(schema_editor, build=True)


class Migration(migrations.Migration):
    dependencies = [
        ("interactions", "0015_stream_parts"),
    ]

    operations = [
        migrations.RunPython(pack_postgres, migrations.RunPython.noop),
        migrations.RunPython(rollup_triggers_drop, rollup_triggers_build),
        migrations.AlterField(
            model_name="interaction",
            name="prompt_token_ids",
            field=apps.interactions.packed.PackedIdsField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="interaction",
            name="completion_token_ids",
            field=apps.interactions.packed.PackedIdsField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="interaction",
            name="completion_logprobs",
            field=apps.interactions.packed.PackedFloatsField(
                blank=True, help_text="behaviour logprob of each completion token", null=True
            ),
        ),
        migrations.RunPython(rollup_triggers_build, rollup_triggers_drop),
        migrations.RunPython(pack_rows, unpack),
    ]
