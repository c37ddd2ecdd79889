from __future__ import annotations

import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from apps.cohorts.models import ConsentChange, EndUser
from apps.interactions.ids import time_ids
from apps.interactions.models import Interaction

pytestmark = pytest.mark.django_db


def item(n: int, **extra):
    body = {
        "client_id": f"c-{n}",
        "prefix": "def add(a, b):\n    ",
        "suffix": "\n",
        "completion": "return a + b",
        "completion_token_ids": [11, 12, 13],
        "completion_logprobs": [-0.1, -0.2, -0.3],
        "model": "starter-small",
        "end_user_id": f"user-{n % 3}",
        "opted_in": True,
        "served_at": "2026-11-21T10:00:00Z",
        "latency_ms": 41.5,
        "metadata": {"language": "python"},
    }
    body.update(extra)
    return body


def test_single_interaction_is_stored_with_every_field(client_a):
    response = client_a.post("/v1/interactions", item(1), format="json")
    assert response.status_code == 201
    body = response.json()
    stored = Interaction.objects.get(pk=body["id"])
    assert stored.tenant == client_a.tenant
    assert (stored.client_id, stored.completion, stored.source) == ("c-1", "return a + b", "logged")
    assert stored.completion_token_ids == [11, 12, 13]
    assert stored.completion_logprobs == [-0.1, -0.2, -0.3]
    assert stored.end_user_opted_in is True and stored.metadata == {"language": "python"}
    assert body["feedback"] is None


def test_replaying_a_single_interaction_returns_the_first_and_stores_nothing(client_a):
    first = client_a.post("/v1/interactions", item(1), format="json").json()
    again = client_a.post("/v1/interactions", item(1, completion="changed"), format="json")
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert Interaction.objects.count() == 1
    assert Interaction.objects.get().completion == "return a + b"


def test_batch_answers_per_item_and_stores_only_the_valid_ones(client_a):
    items = [item(1), item(2, completion_logprobs=[-0.1]), item(3), item(1), {"client_id": "c-4"}]
    response = client_a.post("/v1/interactions", {"items": items}, format="json")
    assert response.status_code == 207
    body = response.json()
    assert [r["status"] for r in body["results"]] == ["created", "rejected", "created", "duplicate", "rejected"]
    assert (body["created"], body["duplicate"], body["rejected"]) == (2, 1, 2)
    assert body["results"][1]["error"]["field"] == "completion_logprobs"
    assert "has 1 values but completion_token_ids has 3" in body["results"][1]["error"]["message"]
    assert body["results"][3]["id"] == body["results"][0]["id"]
    assert set(Interaction.objects.values_list("client_id", flat=True)) == {"c-1", "c-3"}


def test_replayed_batch_adds_nothing(client_a):
    items = [item(n) for n in range(50)]
    first = client_a.post("/v1/interactions", {"items": items}, format="json").json()
    second = client_a.post("/v1/interactions", {"items": items}, format="json").json()
    assert first["created"] == 50 and second["duplicate"] == 50 and second["created"] == 0
    assert [r["id"] for r in first["results"]] == [r["id"] for r in second["results"]]
    assert Interaction.objects.count() == 50


def test_batch_of_stored_and_new_client_ids_stores_the_new_ones_once(client_a):
    """A batch is first written as if all its client ids were new; one already stored undoes that
    attempt entirely (the new users it met, the consent it changed) and the batch is stored again."""
    stored = client_a.post("/v1/interactions", {"items": [item(n) for n in range(0, 20, 2)]}, format="json").json()
    first_ids = {r["client_id"]: r["id"] for r in stored["results"]}
    # the stored items again, now opting out (a replay changes nothing), among new items of a new user
    items = [item(n, opted_in=False) if n % 2 == 0 else item(n, end_user_id="newcomer") for n in range(20)]
    body = client_a.post("/v1/interactions", {"items": items}, format="json").json()
    assert (body["created"], body["duplicate"]) == (10, 10)
    for result in body["results"]:
        n = int(result["client_id"][2:])
        assert result["status"] == ("duplicate" if n % 2 == 0 else "created")
        if n % 2 == 0:
            assert result["id"] == first_ids[result["client_id"]]
    assert Interaction.objects.count() == 20
    assert Interaction.objects.filter(client_id="c-1").get().end_user_id == "newcomer"
    users = EndUser.objects.filter(tenant=client_a.tenant)
    assert users.filter(opted_in=False).count() == 0  # the replayed items' users were not opted out
    assert set(users.values_list("external_id", flat=True)) == {"user-0", "user-1", "user-2", "newcomer"}
    assert ConsentChange.objects.filter(end_user__external_id="newcomer").count() == 1


def post_and_close(pair) -> dict:
    """One batch posted from a worker thread, whose database connection is closed after it (the
    test database is dropped at the end of the run, which open connections would block)."""
    client, items = pair
    try:
        return client.post("/v1/interactions", {"items": items}, format="json").json()
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_sharing_client_ids_store_each_once(tenant, make_client):
    """Two clients send overlapping batches at once: each client id is stored once, created for one
    of them and a duplicate of that same row for the other."""
    clients = [make_client(tenant), make_client(tenant)]
    clients[0].post("/v1/interactions", {"items": [item(n) for n in range(1000, 1003)]}, format="json")  # the users
    batches = [[item(n) for n in range(0, 300)], [item(n) for n in range(150, 450)]]
    for attempt in range(3):
        random.Random(attempt).shuffle(batches[0])  # in any order: rows are written in client id order
        Interaction.objects.filter(client_id__in=[f"c-{n}" for n in range(450)]).delete()
        with ThreadPoolExecutor(2) as pool:
            bodies = list(pool.map(post_and_close, zip(clients, batches, strict=True)))
        verdicts: dict[str, list[tuple[str, str]]] = {}
        for body in bodies:
            for result in body["results"]:
                verdicts.setdefault(result["client_id"], []).append((result["status"], result["id"]))
        stored = dict(Interaction.objects.values_list("client_id", "id"))
        assert len(stored) == 453
        for client_id, seen in verdicts.items():
            assert [status for status, _ in seen].count("created") == 1
            assert {row_id for _, row_id in seen} == {str(stored[client_id])}


def test_batch_costs_the_same_queries_whatever_its_size(client_a):
    def queries_for(start: int, size: int) -> int:
        with CaptureQueriesContext(connection) as ctx:
            response = client_a.post(
                "/v1/interactions", {"items": [item(start + n) for n in range(size)]}, format="json"
            )
        assert response.json()["created"] == size
        return len(ctx.captured_queries)

    client_a.get("/v1/tenant")  # the key's first use writes last_used_at once
    queries_for(5000, 5)  # the end users' first sight creates them once
    assert queries_for(0, 5) == queries_for(1000, 500)


def test_fim_and_plain_prompts_and_empty_completions_are_accepted(client_a):
    items = [
        {"client_id": "fim", "prefix": "x = ", "suffix": "\n", "completion": "1"},
        {"client_id": "plain", "prompt": "import os\n", "completion": "import sys"},
        {"client_id": "silent", "prompt": "pass", "completion": ""},
    ]
    body = client_a.post("/v1/interactions", {"items": items}, format="json").json()
    assert body["created"] == 3
    assert Interaction.objects.get(client_id="silent").completion == ""


def test_time_ids_are_distinct_version_7_uuids_that_sort_by_their_moment():
    base = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    moments = [base + timedelta(milliseconds=7 * i) for i in range(2000)]
    ids = time_ids(moments)
    assert len(set(ids)) == 2000
    for text, moment in zip(ids, moments, strict=True):
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, text)
        assert int.from_bytes(parsed.bytes[:6], "big") == int(moment.timestamp() * 1000)
    assert ids == sorted(ids) and [uuid.UUID(i) for i in ids] == sorted(uuid.UUID(i) for i in ids)
    assert time_ids([]) == []
    assert time_ids([datetime(1960, 1, 1, tzinfo=UTC)])[0].startswith("00000000-0000-7")  # before 1970: 1970


def test_a_logged_interactions_id_carries_its_served_time(tenant, client_a):
    served = "2025-06-01T10:00:00.250Z"
    body = client_a.post(
        "/v1/interactions",
        {"items": [{"client_id": "t1", "prefix": "a", "completion": "b", "served_at": served}]},
        format="json",
    ).json()
    stored = Interaction.objects.get(pk=body["results"][0]["id"])
    assert int.from_bytes(stored.pk.bytes[:6], "big") == int(stored.served_at.timestamp() * 1000)
    assert stored.pk.version == 7
