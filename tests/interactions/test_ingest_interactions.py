from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

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
