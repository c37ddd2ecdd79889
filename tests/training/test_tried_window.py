"""A window a run from the same parent already tried (rejected, or failed after its export) is not
tried again because events wait behind it past ``TRAINING_MAX_WINDOW_EVENTS``: only events the
next window would take start a run, and once the tried window is left out the ones after it do."""

from __future__ import annotations

import pytest

from apps.interactions.models import Feedback
from apps.training.models import TrainingRun, TrainingRunEvent
from apps.training.outlook import training_outlook
from apps.training.services import training_schedule, training_window_exclude

pytestmark = pytest.mark.django_db


def tried_run_over(adapter, interaction_ids, *, status="rejected"):
    """A run from the base that took the events of ``interaction_ids`` (the last one held out) and ended ``status``."""
    run = TrainingRun.objects.create(tenant=adapter.tenant, adapter=adapter, status=status)
    feedback = list(Feedback.objects.filter(interaction_id__in=interaction_ids).order_by("id"))
    TrainingRunEvent.objects.bulk_create(
        TrainingRunEvent(run=run, feedback=f, held_out=index == len(feedback) - 1, reward=0.75)
        for index, f in enumerate(feedback)
    )
    return run


@pytest.mark.parametrize("status", ["rejected", "failed"])
def test_a_tried_window_with_a_backlog_past_the_cap_starts_no_run_again(tiny_adapter, add_events, settings, status):
    settings.TRAINING_MAX_WINDOW_EVENTS = 6
    tried_run_over(tiny_adapter, add_events(6), status=status)
    add_events(10)  # more than min_new_events (8), all past the next window
    assert training_schedule(tiny_adapter) is None
    outlook = training_outlook(tiny_adapter)
    assert (outlook.new, outlook.waiting_behind) == (0, 10)
    assert outlook.verdict.startswith("10 new events wait behind the oldest 6, which a run from this version")


def test_new_events_the_next_window_takes_still_start_a_run(tiny_adapter, add_events, settings):
    settings.TRAINING_MAX_WINDOW_EVENTS = 20
    tried_run_over(tiny_adapter, add_events(6))
    add_events(20)  # the next window takes the 6 tried and the 14 oldest of these
    run = training_schedule(tiny_adapter)
    assert run is not None and run.trigger == "14 new events"


def test_once_the_tried_window_is_left_out_the_events_after_it_start_a_run(tiny_adapter, add_events, settings):
    settings.TRAINING_MAX_WINDOW_EVENTS = 6
    tried = tried_run_over(tiny_adapter, add_events(6))
    add_events(10)
    assert training_schedule(tiny_adapter) is None
    training_window_exclude(tiny_adapter.tenant, run=tried, actor="user:1")
    run = training_schedule(tiny_adapter)
    assert run is not None and run.trigger == "10 new events"  # its window takes the 6 oldest of them
