"""What a snapshot returns: plain dataclasses whose ``as_dict()`` is ready for JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .config import ExperimentConfig

PRIMARY = "primary"
SECONDARY = "secondary"
GUARDRAIL = "guardrail"

BETTER = "better"
WORSE = "worse"
NO_DIRECTION = "none"


def finite_or_none(value: Any) -> float | None:
    """A plain float for JSON, or None for a missing, NaN or infinite value."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def interval(center: Any, half_width: Any) -> list[float] | None:
    lo, hi = finite_or_none(center - half_width), finite_or_none(center + half_width)
    return None if lo is None or hi is None else [lo, hi]


@dataclass(frozen=True)
class MetricResult:
    """Candidate against control on one metric. Lifts are candidate − control; None where undefined."""

    name: str
    label: str
    role: str
    polarity: str
    control: float | None
    candidate: float | None
    abs_lift: float | None
    rel_lift: float | None
    """(candidate − control) / |control|."""
    ci_fixed_abs: list[float] | None
    ci_fixed_rel: list[float] | None
    ci_always_valid_abs: list[float] | None
    p_fixed: float | None
    p_always_valid: float | None
    significant: bool
    """Under the always-valid inference: the confidence sequence at α excludes 0."""
    direction: str
    """``better`` / ``worse`` when significant (by the metric's polarity), else ``none``."""
    adjusted: AdjustedResult | None = None
    """The same lift adjusted by the users' pre-exposure behaviour (CUPED), when the arms carry
    covariates; then ``significant`` and ``direction`` are the adjusted inference's."""
    effective_users: list[float | None] | None = None
    """(control, candidate) Kish effective users by the metric's denominator; below
    ``min_effective_users_per_arm`` in either arm there is no always-valid inference yet."""

    @property
    def decisive_p(self) -> float | None:
        """The always-valid p-value the decision rests on: the adjusted one whenever the arms carry
        covariates (None at a look it cannot test), else the unadjusted one."""
        if self.adjusted is not None:
            return self.adjusted.p_always_valid
        return self.p_always_valid

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "role": self.role,
            "polarity": self.polarity,
            "control": self.control,
            "candidate": self.candidate,
            "abs_lift": self.abs_lift,
            "rel_lift": self.rel_lift,
            "ci_fixed": {"abs": self.ci_fixed_abs, "rel": self.ci_fixed_rel},
            "ci_always_valid": {"abs": self.ci_always_valid_abs},
            "p_fixed": self.p_fixed,
            "p_always_valid": self.p_always_valid,
            "significant": self.significant,
            "direction": self.direction,
            "adjusted": self.adjusted.as_dict() if self.adjusted is not None else None,
            "effective_users": self.effective_users,
        }


@dataclass(frozen=True)
class AdjustedResult:
    """The regression-adjusted lift of one metric (``adjustment.adjusted_lift``)."""

    abs_lift: float | None
    ci_always_valid_abs: list[float] | None
    p_always_valid: float | None
    variance_reduction: float | None
    """1 − adjusted / unadjusted variance of the lift: the share of noise the history explained."""
    users_with_history: int
    covariates_fitted: int = 0
    """Covariates the fit used; 0 where too few users have history (the lift is then unadjusted)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "abs_lift": self.abs_lift,
            "ci_always_valid": {"abs": self.ci_always_valid_abs},
            "p_always_valid": self.p_always_valid,
            "variance_reduction": self.variance_reduction,
            "users_with_history": self.users_with_history,
            "covariates_fitted": self.covariates_fitted,
        }


@dataclass(frozen=True)
class SrmResult:
    observed: list[int]
    expected: list[float]
    statistic: float | None
    p: float | None
    blocked: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "observed": self.observed,
            "expected": self.expected,
            "statistic": self.statistic,
            "p": self.p,
            "blocked": self.blocked,
        }


@dataclass(frozen=True)
class Decision:
    action: str
    """One of ``ACTIONS`` in ``decision``."""
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "reason": self.reason}


@dataclass(frozen=True)
class ExperimentAnalysis:
    arms: dict[str, dict[str, Any]]
    metrics: list[MetricResult]
    srm: SrmResult
    decision: Decision
    config: ExperimentConfig
    elapsed: timedelta

    def metric(self, name: str) -> MetricResult:
        """The result of one metric by name (KeyError if the config did not include it)."""
        return {m.name: m for m in self.metrics}[name]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``json.dumps(..., allow_nan=False)`` accepts it): plain types, None for undefined."""
        return {
            "arms": self.arms,
            "metrics": [m.as_dict() for m in self.metrics],
            "srm": self.srm.as_dict(),
            "decision": self.decision.as_dict(),
            "config": self.config.to_dict(),
            "elapsed_s": self.elapsed.total_seconds(),
        }
