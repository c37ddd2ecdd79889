"""A session outcome spread over a turn while the turn's own feedback is being written (two
connections): the spread does not fail on the feedback it could not see (one row per interaction),
the turn's own feedback wins, and the outcome is stored. On a served chat turn the spread runs
after the answer is recorded (apps.serving.chat), where a failure would lose the client its answer."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.adapters.services import adapter_create, base_model_register
from apps.interactions.models import ConversationOutcome, Feedback
from apps.interactions.served import ServedCompletion, ServedConversation, interactions_record_served
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.interactions.sessions import conversation_outcomes_apply
from tests.fixtures.locks import wait_for_a_waiting_lock

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="two writers at once: SQLite's take turns"),
    pytest.mark.django_db(transaction=True),
]

OUTCOME = {"conversation_id": "s-race", "turn": 0, "outcome": "thumbs_up"}


def _served_turn(tenant, adapter) -> uuid.UUID:
    """A chat turn recorded as apps.serving.chat records it: the interaction, no spread yet."""
    interaction_id = uuid.uuid4()
    interactions_record_served(
        tenant,
        choices=[ServedCompletion(interaction_id, "ok", [5, 6], [-0.5, -0.5], "stop")],
        prompt="", prefix="", suffix="", prompt_token_ids=[1, 2], model_name="tab", adapter_id=adapter.pk,
        adapter_version_id=None, experiment_id=None, experiment_arm="", end_user_id="dev-1", end_user_opted_in=True,
        served_at=timezone.now(), latency_ms=5.0, metadata={"chat": True},
        conversation=ServedConversation([{"role": "user", "content": "hi"}], None, "s-race", 0),
    )  # fmt: skip
    return interaction_id


def _outcome_arrives(tenant, adapter) -> tuple[uuid.UUID, Callable[[], object]]:
    (turn,) = interactions_ingest(
        tenant, items=[{"client_id": "t-0", "messages": [{"role": "user", "content": "hi"}], "completion": "ok",
                        "conversation_id": "s-race", "turn": 0}]
    )  # fmt: skip
    return uuid.UUID(turn.id), lambda: feedback_ingest(tenant, items=[OUTCOME])


def _served_turn_after_its_outcome(tenant, adapter) -> tuple[uuid.UUID, Callable[[], object]]:
    feedback_ingest(tenant, items=[OUTCOME])  # no turn yet: stored, spread over nothing
    interaction_id = _served_turn(tenant, adapter)
    return interaction_id, lambda: conversation_outcomes_apply(tenant, conversation_ids=["s-race"], now=timezone.now())


@pytest.fixture
def adapter(tenant, tiny_starter_model):
    base = base_model_register(name="base", path=tiny_starter_model)
    return adapter_create(tenant, name="tab", base_model=base, is_default=True)


@pytest.mark.parametrize("arrange", [_outcome_arrives, _served_turn_after_its_outcome], ids=["outcome", "served"])
def test_a_spread_meeting_the_turns_own_feedback_leaves_it_and_does_not_fail(tenant, adapter, arrange):
    interaction_id, spread = arrange(tenant, adapter)
    written, release, errors = threading.Event(), threading.Event(), []

    def own_feedback() -> None:
        try:
            with transaction.atomic():  # written, not committed until the spread waits on it
                feedback_ingest(tenant, items=[{"interaction_id": str(interaction_id), "outcome": "thumbs_down"}])
                written.set()
                assert release.wait(30)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    def session_outcome() -> None:
        try:
            spread()
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    first = threading.Thread(target=own_feedback)
    first.start()
    assert written.wait(30)
    second = threading.Thread(target=session_outcome)
    second.start()
    wait_for_a_waiting_lock(60)  # the spread's insert waits on the turn's own, uncommitted feedback
    assert second.is_alive()  # it met the race: waiting, not done past it
    release.set()
    first.join(30)
    second.join(30)
    assert errors == []
    feedback = Feedback.objects.get(interaction_id=interaction_id)
    assert (feedback.outcome, feedback.session_outcome_id, feedback.reward_weight) == ("thumbs_down", None, 1.0)
    assert ConversationOutcome.objects.get(conversation_id="s-race").outcome == "thumbs_up"
