"""One session id and one turn bound on every path: a logged turn, a served chat turn and a session
outcome store a session's id without surrounding whitespace, so an outcome always reaches the turns
it names; and any turn the chat endpoint takes, a session outcome can name."""

from __future__ import annotations

import pytest

from apps.common.item_checks import ItemError
from apps.interactions.contract import MAX_TURN
from apps.interactions.models import ConversationOutcome, Feedback, Interaction
from apps.interactions.validation import feedback_validate, interaction_validate
from apps.serving.chat_schemas import ChatCompletionIn

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.django_db
def test_a_session_outcome_reaches_its_turns_whatever_whitespace_surrounds_the_id(client_a):
    turns = [
        {"client_id": f"t-{n}", "messages": MESSAGES, "completion": "ok", "conversation_id": cid, "turn": n}
        for n, cid in enumerate(["session-17", " session-17\t"])
    ]
    assert client_a.post("/v1/interactions", {"items": turns}, format="json").json()["created"] == 2
    assert set(Interaction.objects.values_list("conversation_id", flat=True)) == {"session-17"}
    outcome = {"conversation_id": "session-17 ", "turn": 1, "discount": 1.0, "outcome": "thumbs_up"}
    assert client_a.post("/v1/feedback", outcome, format="json").status_code < 300
    assert ConversationOutcome.objects.get().conversation_id == "session-17"
    assert Feedback.objects.filter(session_outcome__isnull=False).count() == 2  # both turns carry it


def _chat_takes(conversation_id: str, turn: int) -> tuple[bool, str]:
    body = ChatCompletionIn(data={"messages": MESSAGES, "conversation_id": conversation_id, "turn": turn})
    valid = body.is_valid()
    return valid, body.validated_data["conversation_id"] if valid else ""


def _outcome_names(conversation_id: str, turn: int) -> tuple[bool, str]:
    try:
        item = feedback_validate({"conversation_id": conversation_id, "turn": turn, "outcome": "thumbs_up"})
    except ItemError:
        return False, ""
    return True, item.conversation_id or ""


def _logged_takes(conversation_id: str, turn: int) -> tuple[bool, str]:
    try:
        item = interaction_validate(
            {"client_id": "c", "messages": MESSAGES, "completion": "", "conversation_id": conversation_id, "turn": turn}
        )
    except ItemError:
        return False, ""
    return True, item.conversation_id


@pytest.mark.parametrize("turn", [0, MAX_TURN, MAX_TURN + 1, 200_000, 2**31 - 1])
def test_every_path_takes_the_same_turns_and_the_same_session_id(turn):
    taken = {path(" session-17 ", turn) for path in (_chat_takes, _outcome_names, _logged_takes)}
    assert len(taken) == 1, taken  # taken by all three, or by none
    (accepted, session) = taken.pop()
    assert accepted == (turn <= MAX_TURN) and session == ("session-17" if accepted else "")
