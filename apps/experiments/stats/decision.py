"""From compared metrics to one action with a sentence a person can check against the numbers."""

from __future__ import annotations

from datetime import timedelta

from .config import ExperimentConfig
from .metrics import METRICS
from .results import BETTER, GUARDRAIL, PRIMARY, WORSE, Decision, MetricResult, SrmResult

PROMOTE = "promote"
ROLLBACK = "rollback"
KEEP_RUNNING = "keep_running"
INCONCLUSIVE = "inconclusive"
BLOCKED_SRM = "blocked_srm"
ACTIONS = (PROMOTE, ROLLBACK, KEEP_RUNNING, INCONCLUSIVE, BLOCKED_SRM)


def decide(
    *,
    metrics: list[MetricResult],
    srm: SrmResult,
    users: tuple[int, int],
    config: ExperimentConfig,
    elapsed: timedelta,
) -> Decision:
    """In order: a sample-ratio mismatch blocks everything (until the maximum duration, which ends it
    inconclusive: a broken assignment must not serve the candidate for ever); a significantly worse primary or
    guardrail rolls back (at any sample size: harm is not made to wait); a significantly better
    primary with the minimum sample promotes; past the maximum duration it is inconclusive;
    otherwise keep running. Significance is always-valid, so this may run at every look."""
    if srm.blocked and elapsed >= config.max_duration:
        return Decision(
            INCONCLUSIVE,
            f"Maximum duration of {_duration(config.max_duration)} reached with the sample ratio still mismatched "
            f"({srm.observed[0]:,} control and {srm.observed[1]:,} candidate users, chi-square p = {srm.p:.2g}): no "
            "metric could be trusted, so it ends without a verdict and everyone gets production.",
        )
    if srm.blocked:
        return Decision(
            BLOCKED_SRM,
            f"Sample ratio mismatch: {srm.observed[0]:,} control and {srm.observed[1]:,} candidate users against "
            f"an expected {srm.expected[0]:,.0f} and {srm.expected[1]:,.0f} (chi-square p = {srm.p:.2g} < "
            f"{config.srm_p_threshold:g}). Assignment or exposure logging is broken, so no metric can be "
            "trusted; no decision is made until the cause is fixed.",
        )
    primary = next(m for m in metrics if m.role == PRIMARY)
    harmed = [m for m in metrics if m.role in (PRIMARY, GUARDRAIL) and m.direction == WORSE]
    if harmed:
        return Decision(
            ROLLBACK, "Candidate is significantly worse on " + "; ".join(_describe(m) for m in harmed) + "."
        )

    below_minimum = min(users) < config.min_users_per_arm
    sample = f"{users[0]:,} control and {users[1]:,} candidate users (minimum {config.min_users_per_arm:,} per arm)"
    if primary.direction == BETTER and not below_minimum:
        return Decision(
            PROMOTE,
            f"Candidate is significantly better on {_describe(primary)}; no guardrail is significantly worse; "
            f"{sample}.",
        )

    if primary.direction == BETTER:
        status = f"{primary.name} is significantly better, but the minimum sample is not met: {sample}"
    elif primary.control is None or primary.candidate is None:
        status = f"{primary.name} has no data in one or both arms yet: {sample}"
    elif _too_few_effective_users(primary, config):
        control_eff, candidate_eff = primary.effective_users or (None, None)
        status = (
            f"{primary.name} cannot be tested yet: {_effective(control_eff)} control and {_effective(candidate_eff)} "
            f"candidate effective users, weighting each by their {METRICS[primary.name].denominator} (minimum "
            f"{config.min_effective_users_per_arm:,} per arm; {_why_few(primary, users)}): {sample}"
        )
    elif primary.decisive_p is None:
        status = (
            f"{primary.name} cannot be tested yet (under 2 users in an arm, or no variance between users): {sample}"
        )
    else:
        status = (
            f"{primary.name} shows no significant difference yet ({_numbers(primary)}, "
            f"{_adjusted_word(primary)}always-valid p = {primary.decisive_p:.3g}, needs < {config.alpha:g}); {sample}"
        )
    if elapsed >= config.max_duration:
        return Decision(
            INCONCLUSIVE,
            f"Maximum duration of {_duration(config.max_duration)} reached without a decision: {status}.",
        )
    return Decision(KEEP_RUNNING, f"{status}.")


def _too_few_effective_users(m: MetricResult, config: ExperimentConfig) -> bool:
    return m.effective_users is not None and any(
        e is None or e < config.min_effective_users_per_arm for e in m.effective_users
    )


def _why_few(m: MetricResult, users: tuple[int, int]) -> str:
    """Why an arm has too few effective users: too few users, or a few making most of the sum."""
    uneven = any(e is not None and n > 0 and e < 0.8 * n for e, n in zip(m.effective_users or (), users, strict=False))
    if uneven:
        return "a few users make most of them, and until more arrive the interval would be too narrow"
    return "until more users arrive the interval would be too narrow"


def _effective(count: float | None) -> str:
    return "no" if count is None else f"{count:,.1f}"


def _duration(span: timedelta) -> str:
    """The largest whole unit that states it: '14 days', '6 hours', '90 seconds'."""
    seconds = span.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds:g} seconds"


def _numbers(m: MetricResult) -> str:
    rel = f", {m.rel_lift:+.1%}" if m.rel_lift is not None else ""
    return f"{m.candidate:.4g} vs {m.control:.4g}{rel}"


def _adjusted_word(m: MetricResult) -> str:
    # Where no covariate was fitted (nobody, or too few users, with history) the adjusted lift is the
    # unadjusted one: nothing to say.
    adjusted = m.adjusted is not None and m.adjusted.p_always_valid is not None and m.adjusted.covariates_fitted > 0
    return "adjusted for pre-exposure behaviour, " if adjusted else ""


def _describe(m: MetricResult) -> str:
    return f"{m.name} ({m.role}): {_numbers(m)}, {_adjusted_word(m)}always-valid p = {m.decisive_p:.3g}"
