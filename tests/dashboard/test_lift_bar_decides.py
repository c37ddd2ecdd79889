"""The experiment page's lift bar draws the interval that decides: where the lift was adjusted for
users' history (CUPED), the adjusted one, which the bar's colour and "significant where the band
leaves zero" follow; the unadjusted one otherwise."""

from __future__ import annotations

from apps.dashboard.experiment_results import _metric_row

METRIC = {
    "name": "reward_per_request", "label": "Mean reward per request", "role": "primary",
    "polarity": "higher_is_better", "control": 0.10, "candidate": 0.16, "abs_lift": 0.06,
    "ci_always_valid": {"abs": [0.01, 0.11]},  # unadjusted: clear of zero
    "direction": "none",  # the adjusted inference decided: not significant
}  # fmt: skip


def test_the_bar_draws_the_adjusted_interval_where_it_decides():
    adjusted = {"abs_lift": 0.04, "ci_always_valid": {"abs": [-0.02, 0.10]}, "covariates_fitted": 2}
    row = _metric_row({**METRIC, "adjusted": adjusted}, {})
    bar = str(row.bar)
    assert "adjusted lift 0.04" in bar and "-0.02 to 0.1" in bar  # the band crosses zero, as the decision says
    assert "0.01 to 0.11" not in bar
    assert row.interval == [0.01, 0.11]  # the table keeps the unadjusted figures beside the adjusted ones


def test_without_an_adjustment_the_bar_draws_the_unadjusted_interval():
    bar = str(_metric_row(METRIC, {}).bar)
    assert "lift 0.06" in bar and "0.01 to 0.11" in bar and "adjusted" not in bar
