"""Exposures per arm kept as they change (``ExperimentArmCount``), by triggers on the exposures
table, so that no code path (serving, erase, an experiment or tenant deleted, a raw statement) can
leave the count behind: an insert adds, a delete takes away, an arm or experiment changed moves
one, and an experiment deleted takes its counts with it. Postgres: statement-level with transition
tables for inserts and deletes (one upsert per statement however many rows), a row trigger for the
rare update of an arm. SQLite (the embedded default): row-level.

The triggers go in before the counts are filled from the rows there, in one transaction: on
Postgres creating a trigger locks out writes to the table until the migration commits, so no
exposure is counted twice or missed."""

from django.db import migrations, models

COUNTS = "experiments_experimentarmcount"
EXPOSURES = "experiments_experimentexposure"

_PG = f"""
CREATE OR REPLACE FUNCTION strop_arm_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {COUNTS} AS c (experiment_id, arm, exposures)
    SELECT experiment_id, arm, count(*) FROM added GROUP BY experiment_id, arm
    ON CONFLICT (experiment_id, arm) DO UPDATE SET exposures = c.exposures + EXCLUDED.exposures;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION strop_arm_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {COUNTS} AS c SET exposures = c.exposures - d.n
    FROM (SELECT experiment_id, arm, count(*) AS n FROM removed GROUP BY experiment_id, arm) AS d
    WHERE c.experiment_id = d.experiment_id AND c.arm = d.arm;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION strop_arm_count_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {COUNTS} SET exposures = exposures - 1 WHERE experiment_id = OLD.experiment_id AND arm = OLD.arm;
    INSERT INTO {COUNTS} AS c (experiment_id, arm, exposures) VALUES (NEW.experiment_id, NEW.arm, 1)
    ON CONFLICT (experiment_id, arm) DO UPDATE SET exposures = c.exposures + 1;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION strop_arm_count_forget() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {COUNTS} WHERE experiment_id IN (SELECT id FROM gone);
    RETURN NULL;
END $$;
CREATE TRIGGER strop_arm_count_insert AFTER INSERT ON {EXPOSURES}
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION strop_arm_count_insert();
CREATE TRIGGER strop_arm_count_delete AFTER DELETE ON {EXPOSURES}
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION strop_arm_count_delete();
CREATE TRIGGER strop_arm_count_move AFTER UPDATE OF experiment_id, arm ON {EXPOSURES} FOR EACH ROW
    WHEN (OLD.experiment_id IS DISTINCT FROM NEW.experiment_id OR OLD.arm IS DISTINCT FROM NEW.arm)
    EXECUTE FUNCTION strop_arm_count_move();
CREATE TRIGGER strop_arm_count_forget AFTER DELETE ON experiments_experiment
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION strop_arm_count_forget();
"""

_SQLITE = [
    f"""CREATE TRIGGER strop_arm_count_insert AFTER INSERT ON {EXPOSURES} BEGIN
        INSERT INTO {COUNTS} (experiment_id, arm, exposures) VALUES (NEW.experiment_id, NEW.arm, 1)
        ON CONFLICT (experiment_id, arm) DO UPDATE SET exposures = exposures + 1; END""",
    f"""CREATE TRIGGER strop_arm_count_delete AFTER DELETE ON {EXPOSURES} BEGIN
        UPDATE {COUNTS} SET exposures = exposures - 1 WHERE experiment_id = OLD.experiment_id AND arm = OLD.arm; END""",
    f"""CREATE TRIGGER strop_arm_count_move AFTER UPDATE OF experiment_id, arm ON {EXPOSURES}
        WHEN OLD.experiment_id IS NOT NEW.experiment_id OR OLD.arm IS NOT NEW.arm BEGIN
        UPDATE {COUNTS} SET exposures = exposures - 1 WHERE experiment_id = OLD.experiment_id AND arm = OLD.arm;
        INSERT INTO {COUNTS} (experiment_id, arm, exposures) VALUES (NEW.experiment_id, NEW.arm, 1)
        ON CONFLICT (experiment_id, arm) DO UPDATE SET exposures = exposures + 1; END""",
    f"""CREATE TRIGGER strop_arm_count_forget AFTER DELETE ON experiments_experiment BEGIN
        DELETE FROM {COUNTS} WHERE experiment_id = OLD.id; END""",
]

_FILL = (
    f"INSERT INTO {COUNTS} (experiment_id, arm, exposures) "
    f"SELECT experiment_id, arm, count(*) FROM {EXPOSURES} GROUP BY experiment_id, arm"
)
_TRIGGERS = (
    (EXPOSURES, "strop_arm_count_insert"),
    (EXPOSURES, "strop_arm_count_delete"),
    (EXPOSURES, "strop_arm_count_move"),
    ("experiments_experiment", "strop_arm_count_forget"),
)


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_PG)
    else:
        for statement in _SQLITE:
            schema_editor.execute(statement)
    schema_editor.execute(_FILL)


def backward(apps, schema_editor):
    postgres = schema_editor.connection.vendor == "postgresql"
    for table, name in _TRIGGERS:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}" + (f" ON {table}" if postgres else ""))
    if postgres:
        for _, name in _TRIGGERS:
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {name}()")


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0004_promotion_watch"),
    ]

    operations = [
        migrations.CreateModel(
            name="ExperimentArmCount",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("experiment_id", models.BigIntegerField()),
                ("arm", models.CharField(max_length=16)),
                ("exposures", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("experiment_id", "arm"), name="arm_count_once")],
            },
        ),
        migrations.RunPython(forward, backward),
    ]
