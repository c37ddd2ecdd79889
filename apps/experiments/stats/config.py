"""How an experiment is judged: significance level, metrics, minimum sample, maximum duration."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from apps.common.exceptions import ValidationFailed

from .metrics import METRICS


@dataclass(frozen=True)
class ExperimentConfig:
    """Every field has a default; ``from_dict`` builds one from stored JSON and names a bad field."""

    alpha: float = 0.05
    """Significance level of every test and interval (two-sided), fixed-horizon and always-valid."""
    n_star: float = 5000.0
    """Tuning sample size N* (users, both arms together) of the confidence sequence: it is
    tightest when n reaches about N*, looser before and slowly wider after. Any value keeps the
    error guarantee; a value near the expected final sample gives the most power."""
    weights: tuple[float, float] = (0.5, 0.5)
    """Configured traffic shares of (control, candidate); normalised, checked by the SRM test."""
    primary_metric: str = "reward_per_request"
    """The metric a promotion rests on: mean reward per request, the RL objective."""
    secondary_metrics: tuple[str, ...] = ("accept_rate", "accepted_per_request")
    """Reported with intervals and p-values; they never decide anything."""
    guardrails: tuple[str, ...] = ("accepted_per_request", "slow_request_share", "error_rate", "dissatisfied_rate")
    """Metrics that must not get significantly worse; one that does rolls the candidate back.
    ``suggestion_rate`` is available but off by default: a policy that learns to stay silent when
    it has nothing good to offer lowers it legitimately, and the reward already prices silence.
    ``dissatisfied_rate`` (agents' dissatisfied follow-ups) is 0 in both arms of completion
    traffic, where it never decides anything."""
    min_users_per_arm: int = 100
    """Both arms need this many users before a promotion: the normal approximation behind every
    interval is over users, and per-user counts are skewed. A rollback needs no minimum: the
    always-valid interval is already very wide at small n."""
    min_effective_users_per_arm: int = 20
    """No always-valid inference (and so no decision of either kind, promotion or rollback) on a
    metric until both arms have this many effective users by its denominator
    (``inference.effective_users``: Kish's (Σ x)² / Σ x²). When a few users make most of the
    requests, the delta-method variance is too small and the sequence's normal approximation
    does not hold yet: with log-normal activity (σ = 1.5) peeking gave 0.15–0.24 false
    positives at α = 0.05 without this rule and at most 0.02 with it (docs/experiments.md)."""
    max_duration: timedelta = timedelta(days=14)
    """Past this, an experiment without a decision is ``inconclusive``."""
    srm_p_threshold: float = 0.001
    """A sample-ratio-mismatch p-value below this blocks every decision (strict, because the
    check runs at every look and a false alarm stops a healthy experiment)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", tuple(self.weights))
        object.__setattr__(self, "secondary_metrics", tuple(self.secondary_metrics))
        object.__setattr__(self, "guardrails", tuple(self.guardrails))
        self.validate()

    def validate(self) -> None:
        """Raise ``ValidationFailed`` naming the first bad field."""
        metrics = ", ".join(METRICS)
        checks: list[tuple[bool, str, str]] = [
            (_is_number(self.alpha) and 0 < self.alpha < 1, "alpha", "must be between 0 and 1"),
            (_is_number(self.n_star) and self.n_star > 0, "n_star", "must be > 0"),
            (
                len(self.weights) == 2 and all(_is_number(w) and w > 0 for w in self.weights),
                "weights",
                "must be two numbers > 0 (control, candidate)",
            ),
            (self.primary_metric in METRICS, "primary_metric", f"must be one of {metrics}"),
            (all(m in METRICS for m in self.secondary_metrics), "secondary_metrics", f"must be among {metrics}"),
            (all(m in METRICS for m in self.guardrails), "guardrails", f"must be among {metrics}"),
            (
                isinstance(self.min_users_per_arm, int) and self.min_users_per_arm >= 0,
                "min_users_per_arm",
                "must be an integer >= 0",
            ),
            (
                isinstance(self.min_effective_users_per_arm, int) and self.min_effective_users_per_arm >= 0,
                "min_effective_users_per_arm",
                "must be an integer >= 0",
            ),
            (
                isinstance(self.max_duration, timedelta) and self.max_duration > timedelta(0),
                "max_duration",
                "must be a positive duration",
            ),
            (_is_number(self.srm_p_threshold) and 0 < self.srm_p_threshold < 1, "srm_p_threshold", "must be in (0, 1)"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValidationFailed(f"{name}: {message}", details={"field": name})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``max_duration`` becomes ``max_duration_s``. ``from_dict`` reads it back."""
        data = dataclasses.asdict(self)
        data["weights"] = list(self.weights)
        data["secondary_metrics"] = list(self.secondary_metrics)
        data["guardrails"] = list(self.guardrails)
        data["max_duration_s"] = data.pop("max_duration").total_seconds()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentConfig:
        """Build from JSON (``max_duration_s`` in seconds); unknown keys are an error, not ignored."""
        known = {f.name for f in dataclasses.fields(cls)} - {"max_duration"} | {"max_duration_s"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValidationFailed(
                f"{unknown[0]}: not an experiment setting ({', '.join(sorted(known))})", details={"field": unknown[0]}
            )
        values = dict(data)
        if "max_duration_s" in values:
            seconds = values.pop("max_duration_s")
            if not _is_number(seconds) or seconds <= 0:
                raise ValidationFailed("max_duration_s: must be a number > 0", details={"field": "max_duration_s"})
            values["max_duration"] = timedelta(seconds=seconds)
        for name in ("weights", "secondary_metrics", "guardrails"):
            if name in values and not isinstance(values[name], list | tuple):
                raise ValidationFailed(f"{name}: must be a list", details={"field": name})
        return cls(**values)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
