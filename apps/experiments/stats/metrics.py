"""What is measured: per-user sums of one arm, and the ratio metrics built from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from apps.common.exceptions import ValidationFailed

HIGHER_IS_BETTER = "higher_is_better"
LOWER_IS_BETTER = "lower_is_better"

# The columns of ArmData that hold one number per user.
USER_COLUMNS = (
    "requests",
    "shown",
    "accepted",
    "reward_sum",
    "errors",
    "slow_requests",
    "positive",
    "dissatisfied",
    "sessions",
    "positive_sessions",
    "accepted_chars",
    "retained_chars",
)
# Agents' columns and retained characters: zeros where the data has none (completion traffic has no
# sessions; a client that sends no persistence reports has no retained characters).
OPTIONAL_COLUMNS = ("positive", "dissatisfied", "sessions", "positive_sessions", "accepted_chars", "retained_chars")


@dataclass(frozen=True, eq=False)
class ArmData:
    """Per-user sums for one arm; entry i of every array is the same exposed user.

    A user exposed but without a request yet is a row of zeros: they count as a user (for the
    sample-ratio check and n) and add nothing to any metric.
    """

    requests: NDArray[np.float64]
    """Completion requests served to the user (errors included)."""
    shown: NDArray[np.float64]
    """Suggestions shown (a non-empty completion displayed)."""
    accepted: NDArray[np.float64]
    """Shown suggestions the user accepted."""
    reward_sum: NDArray[np.float64]
    """Sum of the user's rewards under the reward policy (accepted +0.75, rejected −0.25, silent 0)."""
    errors: NDArray[np.float64]
    """Requests that failed."""
    slow_requests: NDArray[np.float64]
    """Requests slower than the CONTROL arm's pooled p95 latency (see ``slow_request_threshold``);
    counted with the same threshold in both arms."""
    latency_p95_ms: float | None = None
    """The arm's own pooled p95 request latency, reported as is (not tested: see slow_request_share)."""
    positive: NDArray[np.float64] | None = None
    """Requests whose answer got a positive outcome (accepted, thumbs up, edit persisted)."""
    dissatisfied: NDArray[np.float64] | None = None
    """Requests followed by a dissatisfied follow-up (the user re-asked or corrected)."""
    sessions: NDArray[np.float64] | None = None
    """Agent sessions (distinct conversation ids) the user had."""
    positive_sessions: NDArray[np.float64] | None = None
    """Sessions with at least one positive outcome."""
    covariates: NDArray[np.float64] | None = None
    """(users, k): each user's behaviour before their first exposure (``adjustment.history_covariates``),
    the same k columns in both arms; None: no adjustment."""
    accepted_chars: NDArray[np.float64] | None = None
    """Characters accepted, of the completions with a persistence report (apps.experiments.retained)."""
    retained_chars: NDArray[np.float64] | None = None
    """Of them, the characters still there at the latest checkpoint reported."""

    def __post_init__(self) -> None:
        users = np.asarray(self.requests).size
        for name in OPTIONAL_COLUMNS:
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(users))
        length = None
        for name in USER_COLUMNS:
            column = np.asarray(getattr(self, name), dtype=np.float64)
            if column.ndim != 1:
                raise ValidationFailed(f"{name}: must be one number per user", details={"field": name})
            if not np.isfinite(column).all():
                raise ValidationFailed(f"{name}: must be finite", details={"field": name})
            if length is not None and column.size != length:
                raise ValidationFailed(
                    f"{name}: {column.size} users, but requests has {length}", details={"field": name}
                )
            length = column.size
            object.__setattr__(self, name, column)
        if self.covariates is not None:
            z = np.asarray(self.covariates, dtype=np.float64)
            if z.ndim != 2 or z.shape[0] != length or not np.isfinite(z).all():
                raise ValidationFailed("covariates: must be finite, one row per user", details={"field": "covariates"})
            object.__setattr__(self, "covariates", z)
        p95 = self.latency_p95_ms
        if p95 is not None and not (np.isfinite(p95) and p95 >= 0):
            raise ValidationFailed("latency_p95_ms: must be a finite number >= 0", details={"field": "latency_p95_ms"})

    @classmethod
    def empty(cls) -> ArmData:
        """An arm nobody has been exposed to yet."""
        columns: dict[str, Any] = {name: np.zeros(0) for name in USER_COLUMNS}
        return cls(**columns)

    @property
    def users(self) -> int:
        return int(self.requests.size)

    def totals(self) -> dict[str, float]:
        return {name: float(getattr(self, name).sum()) for name in USER_COLUMNS}


@dataclass(frozen=True)
class MetricDefinition:
    """A ratio metric Σ numerator / Σ denominator over the users of an arm."""

    name: str
    label: str
    numerator: str
    denominator: str
    polarity: str


METRICS: dict[str, MetricDefinition] = {
    m.name: m
    for m in (
        # The RL objective: what the learner is trained to raise.
        MetricDefinition("reward_per_request", "Mean reward per request", "reward_sum", "requests", HIGHER_IS_BETTER),
        MetricDefinition("accept_rate", "Accept rate of shown suggestions", "accepted", "shown", HIGHER_IS_BETTER),
        MetricDefinition(
            "accepted_per_request", "Accepted suggestions per request", "accepted", "requests", HIGHER_IS_BETTER
        ),
        MetricDefinition("suggestion_rate", "Suggestions shown per request", "shown", "requests", HIGHER_IS_BETTER),
        # The p95 latency guardrail. A percentile of pooled requests is not a mean over users, so
        # it has no user-level variance to test. Instead each user counts the requests slower
        # than the control arm's pooled p95, and the share of slow requests (≈ 5% in control by
        # construction) is a ratio metric like the others: a candidate with a fatter latency
        # tail has more slow requests. The threshold is itself estimated from control data; the
        # delta-method variance computed for the control's share (which is pinned near 5% in
        # truth) stands in roughly for that estimation error. Both arms' p95 are reported as is.
        MetricDefinition(
            "slow_request_share",
            "p95 latency: share of requests slower than the control's p95",
            "slow_requests",
            "requests",
            LOWER_IS_BETTER,
        ),
        MetricDefinition("error_rate", "Failed requests per request", "errors", "requests", LOWER_IS_BETTER),
        # Agents: the user's outcomes per turn and per session; dissatisfaction as a guardrail.
        MetricDefinition(
            "positive_rate",
            "Positive outcomes per turn (accepted, thumbs up, edit persisted)",
            "positive",
            "requests",
            HIGHER_IS_BETTER,
        ),
        MetricDefinition(
            "positive_session_rate",
            "Sessions with a positive outcome per session",
            "positive_sessions",
            "sessions",
            HIGHER_IS_BETTER,
        ),
        MetricDefinition(
            "dissatisfied_rate", "Dissatisfied follow-ups per turn", "dissatisfied", "requests", LOWER_IS_BETTER
        ),
        # What developers keep: from persistence reports (apps.experiments.retained).
        MetricDefinition(
            "retained_chars_per_request",
            "Retained characters per request",
            "retained_chars",
            "requests",
            HIGHER_IS_BETTER,
        ),
        MetricDefinition(
            "retained_share",
            "Retained share of accepted characters",
            "retained_chars",
            "accepted_chars",
            HIGHER_IS_BETTER,
        ),
    )
}


def pooled_p95(latencies_ms: ArrayLike) -> float | None:
    """The p95 of an arm's pooled request latencies (linear interpolation, as Postgres
    ``percentile_cont(0.95)``); None without requests."""
    values = np.asarray(latencies_ms, dtype=np.float64)
    return float(np.percentile(values, 95)) if values.size else None


def slow_request_threshold(control_latencies_ms: ArrayLike) -> float | None:
    """The latency above which a request counts as slow in BOTH arms: the control's pooled p95."""
    return pooled_p95(control_latencies_ms)


def count_slow_requests(
    user_index: ArrayLike, latencies_ms: ArrayLike, threshold_ms: float | None, users: int
) -> NDArray[np.float64]:
    """Per user, the requests strictly slower than ``threshold_ms``.

    ``user_index[i]`` (0 … users − 1) is the user of request i. No threshold (the control has no
    requests yet) counts nothing as slow.
    """
    index = np.asarray(user_index, dtype=np.int64)
    if threshold_ms is None:
        return np.zeros(users)
    slow = np.asarray(latencies_ms, dtype=np.float64) > threshold_ms
    return np.bincount(index, weights=slow.astype(np.float64), minlength=users).astype(np.float64)
