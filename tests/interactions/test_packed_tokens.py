"""Token ids and logprobs are stored packed (``apps.interactions.packed``): what every writer stores
reads back as sent, to the bit, and the migration ``interactions.0016`` packs the rows stored as JSON
(and unpacks them on the way back)."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from apps.interactions.models import Interaction
from apps.interactions.packed import pack_floats, pack_ids, unpack_floats, unpack_ids


def test_pack_and_unpack_round_trip_ids_and_logprobs_exactly():
    ids = [0, 1, 255, 256, 49_151, 128_255, 2**31 - 1]
    logprobs = [0.0, -0.1, -1e-300, -9999.0, -10_000.0, 1e-4, -0.30000000000000004, -math.inf]
    small = [0, 1, 255, 256, 49_151, 65_535]
    assert len(pack_ids(ids) or b"") == 1 + 4 * len(ids) and len(pack_ids(small) or b"") == 1 + 2 * len(small)
    assert unpack_ids(pack_ids(ids)) == ids and unpack_ids(pack_ids(small)) == small
    assert unpack_floats(pack_floats(logprobs)) == logprobs
    assert unpack_ids(memoryview(pack_ids(ids))) == ids  # as psycopg reads bytea
    assert pack_ids([]) == b"" and unpack_ids(b"") == []
    assert pack_ids(None) is None and unpack_floats(None) is None


def test_the_packed_format_says_its_width_and_is_big_endian_as_postgres_writes_it():
    assert pack_ids([1, 256]) == b"\x02\x00\x01\x01\x00"
    assert pack_ids([1, 65_536]) == b"\x04\x00\x00\x00\x01\x00\x01\x00\x00"
    assert pack_floats([-2.0]) == b"\xc0\x00\x00\x00\x00\x00\x00\x00"
    with pytest.raises(ValueError, match="not a width"):
        unpack_ids(b"\x03\x00\x01")


def test_json_text_an_old_process_wrote_into_the_binary_column_reads_as_its_list():
    assert unpack_ids(b"[1, 49151]") == [1, 49151] and unpack_floats(memoryview(b"[-0.5, 0.0]")) == [-0.5, 0.0]
    assert unpack_ids("[3]") == [3] and unpack_floats("[-1.5]") == [-1.5]  # as SQLite gives text back
    assert unpack_floats(pack_floats([1e-4, -1e-4])) == [1e-4, -1e-4]  # a packed logprob never starts with "["


@pytest.mark.django_db
def test_the_batch_api_stores_ids_and_logprobs_packed_and_reads_them_back_as_sent(tenant, make_client):
    client = make_client(tenant)
    prompt_ids = list(range(49_000, 49_152)) + [0, 7]
    logprobs = [-0.123456789012345, -2.5e-7, -9999.0]
    answer = client.post(
        "/v1/interactions",
        {"items": [{"client_id": "f", "prompt": "def f(", "completion": "x):", "prompt_token_ids": prompt_ids,
                    "completion_token_ids": [11, 12, 13], "completion_logprobs": logprobs},
                   {"client_id": "g", "prompt": "def g(", "completion": "", "completion_token_ids": [],
                    "completion_logprobs": []}]},
        format="json",
    )  # fmt: skip
    assert answer.json()["created"] == 2, answer.content
    first, second = (Interaction.objects.get(tenant=tenant, prompt=p) for p in ("def f(", "def g("))
    assert first.prompt_token_ids == prompt_ids and first.completion_token_ids == [11, 12, 13]
    assert first.completion_logprobs == logprobs
    assert second.prompt_token_ids is None and second.completion_token_ids == [] and second.completion_logprobs == []
    answered = client.get(f"/v1/interactions/{first.pk}").json()  # the API answers lists, as sent
    assert answered["prompt_token_ids"] == prompt_ids and answered["completion_logprobs"] == logprobs
    assert answered["completion_token_ids"] == [11, 12, 13]
    listed = {row["client_id"]: row for row in client.get("/v1/interactions").json()["results"]}
    assert listed["g"]["completion_token_ids"] == [] and listed["g"]["prompt_token_ids"] is None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT prompt_token_ids, completion_logprobs FROM interactions_interaction WHERE id = %s", [first.pk]
        )
        raw_ids, raw_logprobs = cursor.fetchone()
    assert bytes(raw_ids) == pack_ids(prompt_ids) and bytes(raw_logprobs) == pack_floats(logprobs)


@pytest.mark.django_db
def test_the_orm_takes_lists_and_the_values_query_gives_lists(tenant):
    Interaction.objects.create(
        tenant=tenant, source="logged", prompt="p", completion="c", prompt_token_ids=[5, 6],
        completion_token_ids=[7], completion_logprobs=[-0.5], served_at=timezone.now(), received_at=timezone.now(),
    )  # fmt: skip
    row = Interaction.objects.filter(tenant=tenant).values("prompt_token_ids", "completion_logprobs").get()
    assert row == {"prompt_token_ids": [5, 6], "completion_logprobs": [-0.5]}
    assert Interaction.objects.filter(tenant=tenant, prompt_token_ids__isnull=False).count() == 1


BEFORE = [("interactions", "0015_stream_parts")]
PACKED = [("interactions", "0016_packed_token_columns")]


@pytest.mark.django_db(transaction=True)  # migrations run outside the test's transaction
def test_the_migration_packs_json_rows_and_unpacks_them_on_the_way_back(make_tenant, migrate_to):
    tenant, now = make_tenant("json-tokens"), timezone.now()
    old_apps = migrate_to(BEFORE)
    model = old_apps.get_model("interactions", "Interaction")
    rows = {
        "wide": ([3, 49_151, 2**31 - 1], [12, 0], [-0.25, -1e-300]),
        "narrow": ([0, 65_535, 7], [65_535], [-0.1]),
        "null logprob": ([5], [6, 7], [-0.5, None]),  # JSON's -inf: no logprobs kept
        "empty": ([], [], []),
        "none": (None, None, None),
    }
    for prompt, (prompt_ids, completion_ids, logprobs) in rows.items():
        model.objects.create(
            tenant_id=tenant.pk, source="logged", prompt=prompt, completion="c", prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids, completion_logprobs=logprobs, served_at=now, received_at=now,
        )  # fmt: skip
    new_model = migrate_to(PACKED).get_model("interactions", "Interaction")
    rows["null logprob"] = ([5], [6, 7], [])
    for prompt, values in rows.items():
        stored = new_model.objects.get(tenant_id=tenant.pk, prompt=prompt)
        assert (stored.prompt_token_ids, stored.completion_token_ids, stored.completion_logprobs) == values
        with connection.cursor() as cursor:  # the SQL packed them as the Python writers do
            cursor.execute(
                "SELECT prompt_token_ids, completion_token_ids, completion_logprobs"
                " FROM interactions_interaction WHERE id = %s", [stored.pk],
            )  # fmt: skip
            raw = [None if value is None else bytes(value) for value in cursor.fetchone()]
        assert raw == [pack_ids(values[0]), pack_ids(values[1]), pack_floats(values[2])]
    back = migrate_to(BEFORE).get_model("interactions", "Interaction")
    for prompt, values in rows.items():
        stored = back.objects.get(tenant_id=tenant.pk, prompt=prompt)
        assert (stored.prompt_token_ids, stored.completion_token_ids, stored.completion_logprobs) == values


ROOT = Path(__file__).resolve().parents[2]
SQLITE_ROWS = """
from django.db import connection
from apps.tenants.services import tenant_create
tenant = tenant_create(name="Embedded", slug="embedded")
with connection.cursor() as cursor:
    for n, (ids, logprobs) in enumerate([("[1, 70000]", "[-0.5]"), ("[2]", "[-0.5, null]"), ("[]", None)]):
        cursor.execute(
            "INSERT INTO interactions_interaction (id, tenant_id, source, prompt, prefix, suffix, completion,"
            " prompt_token_ids, completion_token_ids, completion_logprobs, model_name, experiment_arm, end_user_id,"
            " end_user_opted_in, served_at, received_at, metadata, conversation_id) VALUES (%s, %s, 'logged', %s, '',"
            " '', 'c', %s, '[7]', %s, '', '', '', 0, '2026-01-01', '2026-01-01', '{}', '')",
            [f"{n:032x}", tenant.pk, f"row {n}", ids, logprobs],
        )
"""


def test_the_migration_packs_and_unpacks_on_the_embedded_sqlite_and_keeps_the_rollup_triggers(tmp_path):
    """The embedded default (``make demo``): the table is remade there, which drops its triggers."""
    database = tmp_path / "embedded.sqlite3"
    env = {**os.environ, "DEBUG": "1", "DATABASE_URL": f"sqlite:///{database}"}

    def manage(*args: str) -> None:
        command = [sys.executable, "manage.py", *args]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    def stored() -> tuple[list[tuple], int]:
        with sqlite3.connect(database) as db:
            rows = db.execute(
                "SELECT prompt_token_ids, completion_token_ids, completion_logprobs FROM interactions_interaction"
                " ORDER BY prompt"
            ).fetchall()
            triggers = db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'").fetchone()[0]
        return rows, triggers

    manage("migrate", "interactions", "0015_stream_parts", "-v0")
    manage("shell", "-c", SQLITE_ROWS)
    manage("migrate", "interactions", "0016_packed_token_columns", "-v0")
    rows, triggers = stored()
    assert rows == [
        (pack_ids([1, 70_000]), pack_ids([7]), pack_floats([-0.5])),
        (pack_ids([2]), pack_ids([7]), b""),  # a null logprob (JSON's -inf): none kept
        (b"", pack_ids([7]), None),
    ]
    assert triggers == 6  # 0010's rollup triggers, dropped for the table's remake and built again
    manage("migrate", "interactions", "0015_stream_parts", "-v0")
    rows, triggers = stored()
    assert rows == [("[1,70000]", "[7]", "[-0.5]"), ("[2]", "[7]", "[]"), ("[]", "[7]", None)] and triggers == 6
