"""Agents served elsewhere: interactions that carry a conversation (messages, tools) instead of a prompt."""

from __future__ import annotations

import pytest

from apps.interactions.models import Interaction

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": "Rename x to count."}]
TOOLS = [{"type": "function", "function": {"name": "edit_file", "parameters": {"type": "object"}}}]


def post(client, *items):
    response = client.post("/v1/interactions", {"items": list(items)}, format="json")
    assert response.status_code in (200, 207), response.content
    return response.json()["results"]


def test_a_conversation_is_stored_with_its_tools_session_and_turn(client_a):
    (result,) = post(
        client_a,
        {"client_id": "t-0", "messages": MESSAGES, "tools": TOOLS, "completion": "Done.", "conversation_id": "s-1"},
    )
    row = Interaction.objects.get(pk=result["id"])
    assert (row.messages, row.tools, row.conversation_id, row.turn) == (MESSAGES, TOOLS, "s-1", 0)
    assert row.prompt == "" and row.completion == "Done."


def test_the_turn_is_the_assistant_messages_before_it_unless_named(client_a):
    later = [*MESSAGES, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Also y."}]
    default, named = post(
        client_a,
        {"client_id": "t-1", "messages": later, "completion": "Ok.", "conversation_id": "s-2"},
        {"client_id": "t-2", "messages": later, "completion": "Ok.", "conversation_id": "s-2", "turn": 5},
    )
    assert Interaction.objects.get(pk=default["id"]).turn == 1
    assert Interaction.objects.get(pk=named["id"]).turn == 5


def test_logging_a_conversation_twice_stores_it_once(client_a):
    item = {"client_id": "t-3", "messages": MESSAGES, "completion": "Done.", "conversation_id": "s-3"}
    first = post(client_a, item)[0]
    again = post(client_a, item)[0]
    assert again == {**first, "status": "duplicate"} and Interaction.objects.count() == 1


@pytest.mark.parametrize(
    "item, field",
    [
        ({"messages": MESSAGES, "prompt": "x", "completion": "y"}, "messages"),
        ({"tools": TOOLS, "prompt": "x", "completion": "y"}, "tools"),
        ({"messages": [], "completion": "y"}, "messages"),
        ({"messages": [{"role": "bot", "content": "hi"}], "completion": "y"}, "messages[0].role"),
        ({"messages": [{"role": "user"}], "completion": "y"}, "messages[0].content"),
        ({"messages": [{"role": "tool", "content": "ok"}], "completion": "y"}, "messages[0].tool_call_id"),
        ({"messages": MESSAGES, "completion": "y", "turn": 1}, "turn"),
        ({"messages": MESSAGES, "completion": "y", "conversation_id": "s", "turn": -1}, "turn"),
        ({"messages": MESSAGES, "tools": [{"type": "function", "function": {}}], "completion": "y"}, "tools[0]"),
    ],
)
def test_a_bad_conversation_is_rejected_naming_the_field(client_a, item, field):
    (result,) = post(client_a, {"client_id": "bad", **item})
    assert result["status"] == "rejected" and result["error"]["field"].startswith(field), result
    assert not Interaction.objects.exists()
