"""A window whose accepts run against the model (a client reporting outcomes the wrong way round)
ends its run rejected before training, with the reason, and the tenant keeps what it serves; once
the client resends the outcomes it got wrong, the same window trains; where it cannot, a person
leaves the rejected run's events out and the next run trains on the events after them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.interactions.models import Interaction
from apps.interactions.services.feedback import feedback_ingest
from apps.training.models import TrainingPolicy, TrainingRun
from apps.training.services import training_schedule, training_window_exclude

pytestmark = pytest.mark.django_db(transaction=True)  # the run's heartbeat reads it from a connection of its own


def served_events(add_events, n: int, *, inverted: bool) -> list[str]:
    """``n`` served events whose outcomes cycle accepted, rejected, not_shown, edited; ``inverted``:
    the accepted ones are those the model wrote with the lowest probability, else the highest."""
    ids = add_events(n)
    for k, interaction_id in enumerate(ids):
        unsure = (k % 4 == 0) == inverted
        logprobs = [-4.0, -3.0] if unsure else [-0.2, -0.1 - k / 1000]
        Interaction.objects.filter(pk=interaction_id).update(source="served", completion_logprobs=logprobs)
    return ids


@pytest.fixture
def run_once(tiny_adapter, settings, tmp_path, execute_run):
    settings.STROP_RUN_ROOT = tmp_path
    TrainingPolicy.objects.filter(adapter=tiny_adapter).update(heldout_fraction=0.0)

    def run() -> tuple[str, TrainingRun]:
        # The run a run's end queued (new events had come), else one started now.
        run = TrainingRun.objects.filter(adapter=tiny_adapter, status="queued").first()
        run = run or training_schedule(tiny_adapter, force=True)
        outcome = execute_run(run)
        run.refresh_from_db()
        return outcome, run

    return run


def test_a_window_whose_accepts_the_model_was_least_sure_of_stops_before_training_until_the_client_resends(
    tiny_adapter, add_events, run_once
):
    ids = served_events(add_events, 64, inverted=True)
    outcome, run = run_once()
    assert outcome == "rejected" and run.output_version is None, (outcome, run.error, run.gate)
    assert run.gate["feedback_check"] == "failed" and run.gate["kl_check"] == "skipped"
    assert run.trainer_summary in (None, {}) and "train" not in run.stage_seconds  # stopped before training
    assert "stopped before training: nothing was trained on this window" in run.gate["notes"]
    assert run.gate["feedback_direction"]["auc"] == 0.0
    assert (run.gate["feedback_direction"]["accepted"], run.gate["feedback_direction"]["others"]) == (16, 32)
    assert run.gate["reasons"][0].startswith("the window's feedback runs against the model: its 16 accepted")
    assert "the window's feedback runs against the model" in run.log
    # The events were not used up: the client, fixed, resends the outcomes it got wrong (a later
    # occurred_at replaces each), and the next run takes the same window and trains.
    later = (timezone.now() + timedelta(minutes=1)).isoformat()
    fixed = {0: "rejected", 1: "accepted"}  # what the accepted and the rejected ones really were
    feedback_ingest(tiny_adapter.tenant, items=[
        {"interaction_id": interaction_id, "outcome": fixed[k % 4], "occurred_at": later}
        for k, interaction_id in enumerate(ids) if k % 4 in fixed
    ])
    outcome, run = run_once()
    assert outcome == "candidate" and run.window_size == 64, (outcome, run.error, run.gate)
    assert run.gate["feedback_check"] == "passed" and run.gate["feedback_direction"]["auc"] > 0.5


def test_a_rejected_window_that_cannot_be_resent_is_left_out_and_the_next_run_trains_on_what_followed(
    tiny_adapter, add_events, run_once, settings
):
    settings.TRAINING_MAX_WINDOW_EVENTS = 64  # a window takes the 64 oldest eligible events
    wrong = served_events(add_events, 64, inverted=True)
    outcome, run = run_once()
    assert outcome == "rejected" and run.gate["feedback_check"] == "failed", (outcome, run.error, run.gate)
    assert "leave this run's events out of training" in run.gate["reasons"][0]
    later = served_events(add_events, 64, inverted=False)
    outcome, again = run_once()  # the same oldest window: rejected again
    assert outcome == "rejected" and set(again.events.values_list("feedback_id", flat=True)) == set(
        run.events.values_list("feedback_id", flat=True)
    )
    training_window_exclude(tiny_adapter.tenant, run=run, actor="user:1")
    outcome, run = run_once()
    assert outcome == "candidate" and run.window_size == 64, (outcome, run.error, run.gate)
    trained = {str(i) for i in run.events.values_list("feedback__interaction_id", flat=True)}
    assert trained == set(later) and not trained & set(wrong)
    assert run.gate["feedback_check"] == "passed" and run.gate["feedback_direction"]["auc"] > 0.5
