"""The overview's figures: the definitions stated on the page, computed in SQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.dashboard.stats import Rates, adapter_interactions, adapter_live_numbers, adapter_timeseries
from apps.training.selectors import training_policy_get
from tests.dashboard.conftest import log_events

pytestmark = pytest.mark.django_db


def test_acceptance_counts_only_shown_suggestions_and_reward_only_labelled_requests(world):
    # world: accepted, rejected, edited, not_shown and one without feedback, 5 minutes ago.
    log_events(world.a, outcomes=["accepted", "rejected", None], completion="")  # silence is never "shown"
    policy = training_policy_get(world.adapter)
    live = adapter_live_numbers(world.adapter, policy=policy)
    hour = live.last_hour
    assert (hour.requests, hour.suggestions, hour.shown, hour.accepted, hour.labelled) == (8, 5, 3, 1, 6)
    assert hour.acceptance_rate == pytest.approx(1 / 3)
    assert hour.suggestions_per_request == pytest.approx(5 / 8)
    assert hour.accepted_per_request == pytest.approx(1 / 8)
    # 0.75 - 0.25 + 0.25 + 0 (accepted, rejected, edited, not shown) + 0.75 - 0.25 (the empty ones)
    assert hour.mean_reward == pytest.approx((0.75 - 0.25 + 0.25 + 0 + 0.75 - 0.25) / 6)
    assert live.interactions_per_minute[-1] + live.interactions_per_minute[-2] >= 0
    assert sum(live.interactions_per_minute) == 8 and sum(live.feedback_per_minute) == 6


def test_rates_without_a_denominator_are_none():
    empty = Rates()
    assert (empty.acceptance_rate, empty.suggestions_per_request, empty.mean_reward) == (None, None, None)


def test_the_policy_rewards_are_the_adapters_own(world):
    from apps.training.services import training_policy_update

    training_policy_update(world.a, adapter=world.adapter, actor="system", changes={"reward_rejected": -1.0})
    live = adapter_live_numbers(world.adapter, policy=training_policy_get(world.adapter))
    assert live.last_hour.mean_reward == pytest.approx((0.75 - 1.0 + 0.25 + 0) / 4)


def test_other_tenants_and_other_adapters_are_not_counted(world):
    from apps.adapters.services import adapter_create

    other = adapter_create(world.a, name="chat", base_model=world.adapter.base_model)
    log_events(world.a, outcomes=["accepted"] * 3, adapter_name="chat")
    assert adapter_interactions(world.adapter).count() == 5
    assert adapter_interactions(other).count() == 3


def test_timeseries_puts_requests_in_their_hour_and_marks_the_promotion(world):
    log_events(world.a, outcomes=["accepted", "accepted"], minutes_ago=3 * 60 + 1)
    ts = adapter_timeseries(world.adapter, policy=training_policy_get(world.adapter), range_key="24h")
    assert len(ts.buckets) == 24 and ts.buckets[-1].start <= timezone.now() < ts.buckets[-1].start + timedelta(hours=1)
    by_start = {b.start: b.rates for b in ts.buckets}
    three_hours_ago = (timezone.now() - timedelta(minutes=3 * 60 + 1)).replace(minute=0, second=0, microsecond=0)
    assert by_start[three_hours_ago].accepted == 2
    assert sum(b.rates.requests for b in ts.buckets) == 7
    assert [m.label for m in ts.markers] == ["v1"]
    assert "base model → v1" in ts.markers[0].title


def test_an_unknown_range_falls_back_to_a_day(world):
    ts = adapter_timeseries(world.adapter, policy=training_policy_get(world.adapter), range_key="forever")
    assert ts.range.key == "24h"
