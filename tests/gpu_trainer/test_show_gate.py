"""The show gate's fit: where the threshold goes, and when there is none."""

from __future__ import annotations

import pytest

from gpu_trainer.show_gate import MIN_ACCEPTED, GateEvent, fit_show_threshold, threshold_for_recall, withholds


def events(accepted: list[float], rejected: list[float]) -> list[GateEvent]:
    return [GateEvent(s, True) for s in accepted] + [GateEvent(s, False) for s in rejected]


def test_with_recall_one_the_threshold_is_the_lowest_accepted_score():
    fitted = fit_show_threshold(events([-0.5 - k / 10 for k in range(MIN_ACCEPTED)], [-9.0, -7.0, -0.2]), recall=1.0)
    assert fitted["threshold"] == pytest.approx(-0.5 - (MIN_ACCEPTED - 1) / 10)
    # It withholds the two rejections below it, keeps every accepted one and the one rejection above.
    assert fitted["accepted_kept_share"] == 1.0
    assert fitted["withheld_share"] == pytest.approx(2 / (MIN_ACCEPTED + 3), abs=1e-4)
    assert fitted["accept_rate_after"] == pytest.approx(MIN_ACCEPTED / (MIN_ACCEPTED + 1), abs=1e-4)


def test_a_lower_recall_gives_up_the_lowest_accepted_and_withholds_more():
    accepted = [-float(k) for k in range(20)]  # 0, -1, ..., -19
    rejected = [-k - 0.5 for k in range(20)]
    strict, loose = (fit_show_threshold(events(accepted, rejected), recall=r) for r in (1.0, 0.9))
    assert strict["threshold"] == -19.0 and loose["threshold"] == -17.0
    assert loose["accepted_kept_share"] == pytest.approx(0.9)
    assert loose["withheld_share"] > strict["withheld_share"]


def test_explored_events_weigh_more_and_pull_the_threshold_down():
    """A suggestion shown only by exploration stands for 1 / explore of its kind: the fit must see it so."""
    accepted = [GateEvent(-1.0 - k / 100, True) for k in range(30)]
    explored = GateEvent(-6.0, True, weight=20.0)
    unweighted = fit_show_threshold([*accepted, GateEvent(-6.0, True)], recall=0.95)
    weighted = fit_show_threshold([*accepted, explored], recall=0.95)
    assert unweighted["threshold"] == pytest.approx(-1.29)  # one low accepted event in 31: within the 5 % given up
    assert weighted["threshold"] == -6.0  # weighed 20, it is 40 % of the accepted mass


def test_too_few_accepted_suggestions_place_no_gate():
    assert fit_show_threshold(events([-1.0] * (MIN_ACCEPTED - 1), [-5.0] * 100), recall=0.95) is None
    assert fit_show_threshold(events([-1.0] * MIN_ACCEPTED, []), recall=0.95) is not None


def test_recall_outside_its_range_is_refused():
    with pytest.raises(ValueError, match="recall"):
        fit_show_threshold(events([-1.0] * MIN_ACCEPTED, []), recall=0.0)


def test_threshold_for_recall_and_the_withhold_rule():
    points = [(3.0, 1.0), (1.0, 1.0), (2.0, 2.0)]
    assert threshold_for_recall(points, 1.0) == 1.0
    assert threshold_for_recall(points, 0.75) == 2.0  # gives up weight 1 of 4
    assert threshold_for_recall(points, 0.7) == 2.0 and threshold_for_recall(points, 0.25) == 3.0
    assert withholds(-3.0, -2.0) and not withholds(-2.0, -2.0) and not withholds(-99.0, None)
