"""The show filter's fit: where the threshold goes, and when there is none."""

from __future__ import annotations

import random

import pytest

from learning_shared.show_filter import (
    MIN_ACCEPTED,
    ShowEvent,
    feedback_direction,
    fit_show_threshold,
    in_check_part,
    recall_of,
    threshold_for_recall,
    withholds,
)


def events(accepted: list[float], rejected: list[float]) -> list[ShowEvent]:
    return [ShowEvent(s, True) for s in accepted] + [ShowEvent(s, False) for s in rejected]


def test_with_recall_one_the_threshold_is_the_lowest_accepted_score():
    fitted = fit_show_threshold(events([-0.5 - k / 10 for k in range(MIN_ACCEPTED)], [-9.0, -7.0, -0.2]), recall=1.0)
    assert fitted["threshold"] == pytest.approx(-0.5 - (MIN_ACCEPTED - 1) / 10)
    # It withholds the two rejections below it, keeps every accepted one and the one rejection above.
    assert fitted["window_recall"] == 1.0
    assert fitted["withheld_share"] == pytest.approx(2 / (MIN_ACCEPTED + 3), abs=1e-4)
    assert fitted["accept_rate_after"] == pytest.approx(MIN_ACCEPTED / (MIN_ACCEPTED + 1), abs=1e-4)


def test_a_lower_recall_gives_up_the_lowest_accepted_and_withholds_more():
    accepted = [-float(k) for k in range(20)]  # 0, -1, ..., -19
    rejected = [-k - 0.5 for k in range(20)]
    strict, loose = (fit_show_threshold(events(accepted, rejected), recall=r) for r in (1.0, 0.9))
    assert strict["threshold"] == -19.0 and loose["threshold"] == -17.0
    assert loose["window_recall"] == pytest.approx(0.9)
    assert loose["withheld_share"] > strict["withheld_share"]


def test_explored_events_weigh_more_and_pull_the_threshold_down():
    """A suggestion shown only by exploration stands for 1 / explore of its kind: the fit must see it so."""
    accepted = [ShowEvent(-1.0 - k / 100, True) for k in range(30)]
    explored = ShowEvent(-6.0, True, weight=20.0)
    unweighted = fit_show_threshold([*accepted, ShowEvent(-6.0, True)], recall=0.95)
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


def grouped(group: str, accepted: list[float], rejected: list[float]) -> list[ShowEvent]:
    return [ShowEvent(s, True, group=group) for s in accepted] + [ShowEvent(s, False, group=group) for s in rejected]


def split_groups(count: int) -> tuple[list[str], list[str]]:
    names = [f"user-{k}" for k in range(count)]
    return [g for g in names if not in_check_part(g)], [g for g in names if in_check_part(g)]


def test_a_fit_that_loses_recall_on_other_groups_is_fitted_at_a_higher_recall():
    """The check part's accepted scores sit lower than the fit part's (code the fit never saw):
    fitted at 0.9 on the fit part alone, the threshold would keep about 0.85 of the check part's
    accepted suggestions, so the fit raises its recall until it keeps 0.9 of them."""
    fit_groups, check_groups = split_groups(60)
    window = []
    for k, group in enumerate(fit_groups):  # accepted from -1 down to -4
        window += grouped(group, [-1.0 - 3.0 * k / (len(fit_groups) - 1)], [-8.0])
    for k, group in enumerate(check_groups):  # accepted from -1.5 down to -4.1
        window += grouped(group, [-1.5 - 2.6 * k / (len(check_groups) - 1)], [-8.0])
    fitted = fit_show_threshold(window, recall=0.9)
    assert fitted["fit_recall"] > 0.9 and fitted["check_recall"] >= 0.9
    plain = threshold_for_recall([(e.score, 1.0) for e in window if e.accepted and not in_check_part(e.group)], 0.9)
    assert recall_of([e for e in window if in_check_part(e.group)], plain) < 0.88
    assert fitted["window_recall"] > 0.9 and fitted["threshold"] < plain


def test_groups_alike_need_no_more_recall_and_no_groups_skip_the_check():
    fit_groups, check_groups = split_groups(40)
    window = [e for g in fit_groups + check_groups for e in grouped(g, [-1.0 - k / 10 for k in range(3)], [-9.0])]
    alike = fit_show_threshold(window, recall=0.8)
    assert alike["check_recall"] >= 0.8 and alike["fit_recall"] < 0.9
    ungrouped = fit_show_threshold(events([-1.0 - k / 10 for k in range(30)], [-9.0]), recall=0.8)
    assert ungrouped["check_recall"] is None and ungrouped["fit_recall"] == 0.8


def test_feedback_direction_is_the_roc_auc_of_the_score_with_ties_counting_half():
    rng = random.Random(5)
    accepted = [round(rng.gauss(-3, 2)) for _ in range(25)]  # rounded: many ties
    others = [round(rng.gauss(-7, 2)) for _ in range(120)]
    pairs = sum((a > o) + 0.5 * (a == o) for a in accepted for o in others) / (len(accepted) * len(others))
    direction = feedback_direction(events(accepted, others))
    assert direction["auc"] == pytest.approx(pairs, abs=1e-4)
    assert (direction["accepted"], direction["others"]) == (25, 120)
    assert direction["z"] > 4


def test_feedback_reported_the_wrong_way_round_turns_the_direction_over():
    accepted, others = [-1.0 - k / 10 for k in range(20)], [-5.0 - k / 10 for k in range(150)]
    clean, inverted = feedback_direction(events(accepted, others)), feedback_direction(events(others, accepted))
    assert clean["auc"] == 1.0 and inverted["auc"] == 0.0
    assert inverted["z"] == -clean["z"] < -4


def test_feedback_direction_needs_enough_on_both_sides_and_ignores_unscored_events():
    few = [-1.0] * (MIN_ACCEPTED - 1)
    assert feedback_direction(events(few, [-5.0] * 50)) is None
    assert feedback_direction(events([-5.0] * 50, few)) is None
    enough = [-1.0] * MIN_ACCEPTED
    assert feedback_direction(events(enough + [float("-inf")], [-5.0] * MIN_ACCEPTED))["accepted"] == MIN_ACCEPTED
    assert feedback_direction(events(enough, [-1.0] * MIN_ACCEPTED))["auc"] == 0.5  # every pair tied
