"""Logging and reading interactions with the sync client."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.utils import timezone
from strop import BatchResult, EditorOutcome, NotFoundError, Page
from strop import Interaction as SdkInteraction

from apps.interactions.models import Interaction

pytestmark = pytest.mark.django_db(transaction=True)


def item(client_id: str, **fields):
    return {
        "client_id": client_id,
        "prefix": "def add(a, b):\n    ",
        "suffix": "\n",
        "completion": "return a + b",
        **fields,
    }


def test_log_returns_the_stored_interaction_and_a_replay_returns_the_same_one(strop_client, api):
    served_at = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
    first = strop_client.interactions.log(
        client_id="cmp-1",
        prefix="def add(a, b):\n    ",
        suffix="\n",
        completion="return a + b",
        completion_token_ids=[689, 264, 489, 293],
        completion_logprobs=[-0.1, -0.3, -0.05, -0.2],
        model="qwen",
        end_user_id="dev-42",
        opted_in=True,
        served_at=served_at,
        latency_ms=41,
        metadata={"language": "python"},
    )
    assert isinstance(first, SdkInteraction) and first.created is True
    assert (first.client_id, first.end_user_id, first.opted_in, first.served_at) == ("cmp-1", "dev-42", True, served_at)
    assert first.completion_token_ids == [689, 264, 489, 293] and first.metadata == {"language": "python"}

    replay = strop_client.interactions.log(client_id="cmp-1", prompt="something else", completion="x")
    assert replay.created is False and replay.id == first.id and replay.completion == "return a + b"
    assert Interaction.objects.filter(tenant=api.tenant).count() == 1


def test_log_batch_gives_a_verdict_per_item_and_stores_only_the_valid_ones(strop_client, api):
    strop_client.interactions.log(**item("known"))
    result = strop_client.interactions.log_batch(
        [
            item("a"),
            item("known"),
            item("b", completion_token_ids=[1, 2, 3], completion_logprobs=[-0.1]),
            item("a"),
        ]
    )
    assert isinstance(result, BatchResult)
    assert result.counts == {"created": 1, "duplicate": 2, "rejected": 1}
    assert [r.status for r in result.results] == ["created", "duplicate", "rejected", "duplicate"]
    assert result.results[3].id == result.results[0].id
    (rejected,) = result.rejected
    assert (rejected.index, rejected.client_id) == (2, "b")
    assert (rejected.error.code, rejected.error.field) == ("length_mismatch", "completion_logprobs")
    stored = set(Interaction.objects.filter(tenant=api.tenant).values_list("client_id", flat=True))
    assert stored == {"known", "a"}


def test_replaying_a_batch_stores_nothing_new(strop_client, api):
    batch = [item(f"r-{i}") for i in range(5)]
    first = strop_client.interactions.log_batch(batch)
    again = strop_client.interactions.log_batch(batch)
    assert first.counts["created"] == 5 and again.counts == {"created": 0, "duplicate": 5, "rejected": 0}
    assert [r.id for r in again.results] == [r.id for r in first.results]
    assert Interaction.objects.filter(tenant=api.tenant).count() == 5


def test_get_reads_an_interaction_back_with_its_feedback(strop_client):
    logged = strop_client.interactions.log(**item("g-1"))
    strop_client.feedback.send(interaction_id=logged.id, outcome="edited", kept_text="return a+b")
    read = strop_client.interactions.get(logged.id)
    assert read.id == logged.id and read.created is None and read.prefix == "def add(a, b):\n    "
    assert read.feedback is not None
    assert (read.feedback.outcome, read.feedback.kept_text, read.feedback.events_received) == (
        "edited",
        "return a+b",
        1,
    )


def test_another_tenants_interaction_is_not_found(strop_client, make_api):
    from strop import Strop

    other = make_api()
    with Strop(base_url=other.url, api_key=other.key) as other_client:
        theirs = other_client.interactions.log(**item("theirs"))
    with pytest.raises(NotFoundError) as caught:
        strop_client.interactions.get(theirs.id)
    assert caught.value.status == 404 and caught.value.code == "not_found"


def test_list_pages_through_every_interaction_newest_first(strop_client):
    ids = [strop_client.interactions.log(**item(f"p-{i}", end_user_id="dev-1")).id for i in range(7)]
    strop_client.interactions.log(**item("someone-else", end_user_id="dev-2"))
    seen: list[str] = []
    page = strop_client.interactions.list(end_user_id="dev-1", limit=3)
    pages = 1
    while page.next_offset is not None:
        assert isinstance(page, Page) and page.count == 7 and len(page.results) == 3
        seen += [interaction.id for interaction in page.results]
        page = strop_client.interactions.list(end_user_id="dev-1", limit=3, offset=page.next_offset)
        pages += 1
    seen += [interaction.id for interaction in page.results]
    assert pages == 3 and page.previous_offset == 3
    assert seen == list(reversed(ids))


def test_an_agent_turn_reads_back_with_its_conversation(strop_client):
    messages = [{"role": "user", "content": "Rename x to count"}]
    tools = [{"type": "function", "function": {"name": "edit_file", "parameters": {"type": "object"}}}]
    logged = strop_client.interactions.log(
        client_id="turn-0", messages=messages, tools=tools, completion="Done.", conversation_id="s-1", turn=0
    )
    read = strop_client.interactions.get(logged.id)
    assert (read.messages, read.tools, read.conversation_id, read.turn) == (messages, tools, "s-1", 0)
    assert (logged.messages, logged.conversation_id) == (messages, "s-1")
    plain = strop_client.interactions.get(strop_client.interactions.log(**item("plain")).id)
    assert plain.turn is None and not plain.conversation_id and not plain.messages and not plain.tools


def test_an_editor_autocomplete_outcome_is_stored_with_its_feedback_once(strop_client, api):
    outcome = {
        "completionId": "continue-1",
        "prefix": "def add(a, b):\n    ",
        "suffix": "\n",
        "completion": "return a + b",
        "modelName": "qwen",
        "accepted": True,
    }
    first = strop_client.editor.autocomplete_outcome(outcome, user="dev-7")
    assert (first.status, first.linked_to_served) == ("created", False)
    assert first.interaction is not None and first.feedback is not None and first.feedback.status == "recorded"
    stored = Interaction.objects.get(tenant=api.tenant, client_id="continue-1")
    assert (str(stored.pk), stored.end_user_id, stored.completion) == (first.interaction.id, "dev-7", "return a + b")
    assert stored.feedback.get().outcome == "accepted"

    again = strop_client.editor.autocomplete_outcome(outcome, user="dev-7")
    assert again.status == "duplicate" and again.interaction.id == first.interaction.id
    ignored = strop_client.editor.autocomplete_outcome({"name": "chatFeedback", "data": {}, "schema": "0.2.0"})
    assert ignored.status == "ignored" and ignored.reason
    assert Interaction.objects.filter(tenant=api.tenant).count() == 1


def test_an_editor_outcome_on_a_completion_strop_served_is_linked_and_says_so(strop_client, api):
    now = timezone.now()
    served = Interaction.objects.create(
        tenant=api.tenant, source="served", prompt="x = ", completion="1 + 2", served_at=now, received_at=now
    )
    outcome = {"completionId": "continue-9", "prompt": "x = ", "completion": "1 + 2", "accepted": False}
    linked = strop_client.editor.autocomplete_outcome(outcome, user="dev-7")
    assert (linked.status, linked.linked_to_served) == ("linked", True)
    assert linked.interaction is not None and linked.interaction.id == str(served.pk)
    assert Interaction.objects.filter(tenant=api.tenant).count() == 1  # no interaction of its own
    # Every status the API answers (apps.interactions.editor and .apis) is one the result's docs name.
    documented = EditorOutcome.__doc__ or ""
    assert all(f"``{status}``" in documented for status in ("created", "duplicate", "linked", "ignored"))
