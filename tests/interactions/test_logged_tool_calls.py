"""A logged agent turn carries its reply's tool calls (`tool_calls`, OpenAI's assistant shape),
checked as the chat endpoint checks an assistant message's and stored where a served turn keeps
them (metadata.tool_calls); a malformed one is a 400 naming the field, and nothing is stored."""

from __future__ import annotations

import pytest

from apps.interactions.models import Interaction

pytestmark = pytest.mark.django_db

CALL = {"id": "call-1", "type": "function", "function": {"name": "edit_file", "arguments": '{"path": "a.py"}'}}
TURN = {
    "client_id": "turn-1",
    "messages": [{"role": "user", "content": "Rename x to count"}],
    "completion": "",
    "conversation_id": "s-1",
    "turn": 0,
}


def test_a_logged_turn_stores_its_tool_calls_where_a_served_turn_keeps_them(client_a):
    response = client_a.post("/v1/interactions", {**TURN, "tool_calls": [CALL], "metadata": {"k": 1}}, format="json")
    assert response.status_code == 201, response.json()
    stored = Interaction.objects.get(client_id="turn-1")
    assert stored.metadata == {"k": 1, "tool_calls": [CALL]} and stored.completion == ""


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        (
            {"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
            "tool_calls[0].function.arguments",
        ),
        ({"tool_calls": [{"id": "c", "type": "function"}]}, "tool_calls[0]"),
        ({"tool_calls": []}, "tool_calls"),
        ({"tool_calls": {"name": "f"}}, "tool_calls"),
        ({"tool_calls": [CALL], "metadata": {"tool_calls": [CALL]}}, "tool_calls"),
        ({"tool_calls": [CALL], "messages": None, "prompt": "x = "}, "tool_calls"),
        ({"tool_calls": [CALL], "completion_token_ids": []}, "completion_token_ids"),
    ],
)
def test_a_malformed_tool_call_is_a_400_naming_the_field(client_a, patch, field):
    item = {key: value for key, value in {**TURN, **patch}.items() if value is not None}
    response = client_a.post("/v1/interactions", item, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["message"].startswith(f"{field}:")
    assert not Interaction.objects.exists()
