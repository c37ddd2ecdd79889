"""One snapshot of an experiment: per-arm summaries, every metric compared, SRM, the decision."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np

from . import adjustment, inference
from .config import ExperimentConfig
from .decision import decide
from .metrics import HIGHER_IS_BETTER, METRICS, ArmData, MetricDefinition
from .results import (
    BETTER,
    GUARDRAIL,
    NO_DIRECTION,
    PRIMARY,
    SECONDARY,
    WORSE,
    AdjustedResult,
    ExperimentAnalysis,
    MetricResult,
    SrmResult,
    finite_or_none,
    interval,
)


def metric_roles(config: ExperimentConfig) -> list[tuple[str, str]]:
    """(metric, role) in display order; a metric listed twice keeps its strongest role
    (primary > guardrail > secondary): being a guardrail is what changes the decision."""
    roles = [(config.primary_metric, PRIMARY)]
    for name in config.guardrails:
        if name not in dict(roles):
            roles.append((name, GUARDRAIL))
    for name in config.secondary_metrics:
        if name not in dict(roles):
            roles.append((name, SECONDARY))
    return roles


def analyze(
    control: ArmData, candidate: ArmData, *, config: ExperimentConfig | None = None, elapsed: timedelta
) -> ExperimentAnalysis:
    """Compare the candidate arm with the control arm; pure and deterministic.

    ``elapsed``: time since the experiment started; at ``config.max_duration`` an undecided
    experiment is ``inconclusive``.
    """
    config = config or ExperimentConfig()
    srm = _srm(control.users, candidate.users, config)
    metrics = [_compare(METRICS[name], role, control, candidate, config) for name, role in metric_roles(config)]
    decision = decide(
        metrics=metrics,
        srm=srm,
        users=(control.users, candidate.users),
        config=config,
        elapsed=elapsed,
    )
    return ExperimentAnalysis(
        arms={
            "control": _arm_summary(control, config.weights[0] / sum(config.weights)),
            "candidate": _arm_summary(candidate, config.weights[1] / sum(config.weights)),
        },
        metrics=metrics,
        srm=srm,
        decision=decision,
        config=config,
        elapsed=elapsed,
    )


def _srm(control_users: int, candidate_users: int, config: ExperimentConfig) -> SrmResult:
    observed = [control_users, candidate_users]
    statistic, p = inference.srm_chi_square(observed, config.weights)
    total_weight = sum(config.weights)
    p_value = finite_or_none(p)
    return SrmResult(
        observed=observed,
        expected=[sum(observed) * w / total_weight for w in config.weights],
        statistic=finite_or_none(statistic),
        p=p_value,
        blocked=p_value is not None and p_value < config.srm_p_threshold,
    )


def _arm_summary(arm: ArmData, weight: float) -> dict[str, Any]:
    totals = arm.totals()
    summary: dict[str, Any] = {"users": arm.users, "weight": weight}
    for name, total in totals.items():
        # Counts read better as integers; a fractional count (not expected) is kept as it is.
        summary[name] = int(total) if name != "reward_sum" and total.is_integer() else total
    for metric in METRICS.values():
        den = totals[metric.denominator]
        summary[metric.name] = totals[metric.numerator] / den if den else None
    summary["latency_p95_ms"] = finite_or_none(arm.latency_p95_ms)
    return summary


def _compare(
    metric: MetricDefinition, role: str, control: ArmData, candidate: ArmData, config: ExperimentConfig
) -> MetricResult:
    def moments(arm: ArmData) -> inference.RatioMoments:
        return inference.RatioMoments.from_users(getattr(arm, metric.numerator), getattr(arm, metric.denominator))

    a, b = moments(control), moments(candidate)
    est_a, est_b = inference.ratio_estimate(a), inference.ratio_estimate(b)
    var_a, var_b = inference.ratio_variance(a), inference.ratio_variance(b)
    diff = est_b - est_a
    se = np.sqrt(var_a + var_b)
    rel = inference.relative_lift(est_a, est_b)
    rel_se = np.sqrt(inference.relative_lift_variance(est_a, var_a, est_b, var_b))
    n_total = control.users + candidate.users
    effective = [finite_or_none(inference.effective_users(a)), finite_or_none(inference.effective_users(b))]

    # No inference without a standard error: both arms constant (or under 2 users) says nothing
    # about the population, so nothing is declared significant on it.
    testable = bool(np.isfinite(se) and se > 0)
    # Nor, in either direction, before each arm has enough effective users: with a few users
    # making most of the requests the variance is underestimated and the sequence loses its
    # guarantee. The fixed-horizon figures stay on the page; they never decide.
    enough = enough_effective_users(effective, config)
    sequential = testable and enough
    z = inference.z_quantile(config.alpha)
    p_fixed = finite_or_none(inference.fixed_p_value(diff, se)) if testable else None
    p_av = finite_or_none(inference.always_valid_p_value(diff, se, n_total, config.n_star)) if sequential else None
    av_half = inference.always_valid_half_width(se, n_total, config.alpha, config.n_star) if sequential else np.nan
    rel_testable = bool(np.isfinite(rel_se) and rel_se > 0)

    significant = sequential and abs(float(diff)) > float(av_half)
    adjusted = _adjusted(metric, control, candidate, config, sequential=enough)
    decisive: float | inference.FloatArray = diff
    if adjusted is not None:
        # Where the arms carry covariates the adjusted sequence alone decides, at every look: a
        # look it cannot test is not significant (never handed to the unadjusted sequence).
        significant = False
        if adjusted.abs_lift is not None and adjusted.ci_always_valid_abs is not None:
            low, high = adjusted.ci_always_valid_abs
            significant = low > 0 or high < 0
            decisive = adjusted.abs_lift
    direction = NO_DIRECTION
    if significant:
        higher = float(decisive) > 0
        direction = BETTER if higher == (metric.polarity == HIGHER_IS_BETTER) else WORSE
    return MetricResult(
        name=metric.name,
        label=metric.label,
        role=role,
        polarity=metric.polarity,
        control=finite_or_none(est_a),
        candidate=finite_or_none(est_b),
        abs_lift=finite_or_none(diff),
        rel_lift=finite_or_none(rel),
        ci_fixed_abs=interval(diff, z * se) if testable else None,
        ci_fixed_rel=interval(rel, z * rel_se) if rel_testable else None,
        ci_always_valid_abs=interval(diff, av_half) if sequential else None,
        p_fixed=p_fixed,
        p_always_valid=p_av,
        significant=significant,
        direction=direction,
        adjusted=adjusted,
        effective_users=effective,
    )


def enough_effective_users(effective: list[float | None], config: ExperimentConfig) -> bool:
    """Both arms have ``config.min_effective_users_per_arm`` effective users (None: no denominator)."""
    return all(e is not None and e >= config.min_effective_users_per_arm for e in effective)


def _adjusted(
    metric: MetricDefinition, control: ArmData, candidate: ArmData, config: ExperimentConfig, *, sequential: bool
) -> AdjustedResult | None:
    """The lift adjusted by pre-exposure covariates, or None when the arms carry none.

    Whenever the arms carry covariates this one estimator decides, from the first look to the
    last, whatever the number of users with history: switching from the unadjusted lift to the
    adjusted one at some count would peek on two sequences (up to about 2α). With nobody with
    history the covariates are constant, the fit drops them and the adjusted lift is the
    unadjusted one; with a few, the history indicator gives them their own level and the fitted
    covariates cost their degrees of freedom, counted against those few (``adjustment.adjusted_lift``).
    A look where the adjusted lift has no standard error is not testable: nothing falls back; nor
    is one without enough effective users (``sequential`` false), as for the unadjusted lift."""
    za, zb = control.covariates, candidate.covariates
    if za is None or zb is None or za.shape[1] != zb.shape[1] or za.shape[1] == 0:
        return None
    with_history = int(za[:, -1].sum() + zb[:, -1].sum())  # the last column is the history indicator
    ya, xa = getattr(control, metric.numerator), getattr(control, metric.denominator)
    yb, xb = getattr(candidate, metric.numerator), getattr(candidate, metric.denominator)
    lift = adjustment.adjusted_lift(
        inference.RatioMoments.from_users(ya, xa),
        inference.RatioMoments.from_users(yb, xb),
        adjustment.CovariateMoments.from_users(za, ya, xa),
        adjustment.CovariateMoments.from_users(zb, yb, xb),
    )
    se = float(lift.se)
    if not (np.isfinite(se) and se > 0):
        return AdjustedResult(None, None, None, None, with_history)
    if not sequential:
        return AdjustedResult(
            abs_lift=finite_or_none(lift.diff),
            ci_always_valid_abs=None,
            p_always_valid=None,
            variance_reduction=finite_or_none(lift.variance_reduction),
            users_with_history=with_history,
            covariates_fitted=int(lift.fitted),
        )
    n_total = control.users + candidate.users
    half = inference.always_valid_half_width(se, n_total, config.alpha, config.n_star)
    return AdjustedResult(
        abs_lift=finite_or_none(lift.diff),
        ci_always_valid_abs=interval(lift.diff, half),
        p_always_valid=finite_or_none(inference.always_valid_p_value(lift.diff, se, n_total, config.n_star)),
        variance_reduction=finite_or_none(lift.variance_reduction),
        users_with_history=with_history,
        covariates_fitted=int(lift.fitted),
    )
