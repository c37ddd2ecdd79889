"""Token ids and logprobs from ``jsonb`` to packed ``bytea`` (``apps.interactions.packed``).

On Postgres one ``ALTER TABLE`` rewrites the table, converting in SQL (``int4send`` and
``float8send`` write the packed format), under an exclusive lock on the interactions table: at
about a million rows a minute on a small box, plan it with the upgrade (docs/operate.md). On
other databases (the embedded SQLite) ``AlterField`` remakes the table and the rows are converted
here, a thousand at a time."""

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
      SELECT string_agg(int4send(e::int4), ''::bytea ORDER BY n) FROM jsonb_array_elements_text(j) WITH ORDINALITY AS t(e, n))
  END
$$;
CREATE OR REPLACE FUNCTION pg_temp.strop_pack_floats(j jsonb) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN jsonb_typeof(j) = 'array' THEN coalesce(
    (SELECT string_agg(float8send(e::float8), ''::bytea ORDER BY n) FROM jsonb_array_elements_text(j) WITH ORDINALITY AS t(e, n)),
    ''::bytea) END
$$;
"""

def _pack_postgres(schema_editor, table: str) -> None:
    using = ", ".join(
        f"ALTER COLUMN {column} TYPE bytea USING pg_temp.strop_pack_{kind}({column})" for column, kind in COLUMNS.items()
    )
    schema_editor.execute(PG_FUNCTIONS)
    schema_editor.execute(f"ALTER TABLE {table} {using}")
    schema_editor.execute("DROP FUNCTION pg_temp.strop_pack_ids(jsonb); DROP FUNCTION pg_temp.strop_pack_floats(jsonb)")


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
    if schema_editor.connection.vendor == "postgresql":
        _pack_postgres(schema_editor, apps.get_model("interactions", "Interaction")._meta.db_table)


def pack_rows(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Other databases: ``AlterField`` remade the table with the JSON text copied; packed here."""
    import json

    from apps.interactions.packed import pack_floats, pack_ids

    if schema_editor.connection.vendor == "postgresql":
        return

    def convert(kind, value):  # type: ignore[no-untyped-def]
        if value is None or isinstance(value, (bytes, memoryview)):
            return value
        parsed = json.loads(value)
        if not isinstance(parsed, list):
            return None
        return pack_ids(parsed) if kind == "ids" else pack_floats(parsed)

    _convert_rows(schema_editor, apps.get_model("interactions", "Interaction")._meta.db_table, convert)


def unpack(apps, schema_editor):  # type: ignore[no-untyped-def]
    """The way back, before ``AlterField`` is undone: JSON again (Postgres: through hex text,
    converted here, then typed ``jsonb``; other databases: JSON text in the binary column)."""
    import json

    from apps.interactions.packed import unpack_floats, unpack_ids

    table = apps.get_model("interactions", "Interaction")._meta.db_table
    postgres = schema_editor.connection.vendor == "postgresql"

    def convert(kind, value):  # type: ignore[no-untyped-def]
        if value is None:
            return None
        raw = bytes.fromhex(value) if postgres else value
        return json.dumps(unpack_ids(raw) if kind == "ids" else unpack_floats(raw))

    if postgres:
        hexed = ", ".join(f"ALTER COLUMN {c} TYPE text USING encode({c}, 'hex')" for c in COLUMNS)
        schema_editor.execute(f"ALTER TABLE {table} {hexed}")
    _convert_rows(schema_editor, table, convert)
    if postgres:
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the updates' deferred checks, before ALTER
        typed = ", ".join(f"ALTER COLUMN {c} TYPE jsonb USING {c}::jsonb" for c in COLUMNS)
        schema_editor.execute(f"ALTER TABLE {table} {typed}")


class Migration(migrations.Migration):
    dependencies = [
        ("interactions", "0015_stream_parts"),
    ]

    operations = [
        migrations.RunPython(pack_postgres, migrations.RunPython.noop),
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
        migrations.RunPython(pack_rows, unpack),
    ]
