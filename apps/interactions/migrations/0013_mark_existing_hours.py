"""An install upgraded from before rollups has interactions and empty rollup tables: mark every
(tenant, hour) that has interactions, so the next refresh (beat, every few seconds) builds them. One
``INSERT ... SELECT DISTINCT``; the refresh then works through the marks a window at a time."""

from django.db import migrations

_HOUR = {
    "postgresql": "date_trunc('hour', served_at, 'UTC')",
    "sqlite": "strftime('%Y-%m-%d %H:00:00', served_at)",
}


def mark_sql(vendor: str) -> str:
    if vendor not in _HOUR:
        raise RuntimeError(f"no hour expression for {vendor}")
    return (
        "INSERT INTO interactions_rollupdirty (tenant_id, hour) "
        f"SELECT DISTINCT tenant_id, {_HOUR[vendor]} FROM interactions_interaction"
    )


def mark_existing_hours(apps, schema_editor):
    schema_editor.execute(mark_sql(schema_editor.connection.vendor))


class Migration(migrations.Migration):
    dependencies = [("interactions", "0012_merge_persistence_rollups")]

    operations = [migrations.RunPython(mark_existing_hours, migrations.RunPython.noop)]
