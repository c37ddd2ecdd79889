"""Statistics of Strop's A/B experiments: a candidate adapter version against production.

Pure numpy + scipy (no Django): the caller aggregates per-user sums for each arm into
``ArmData``, calls ``analyze(control, candidate, config=..., elapsed=...)`` and stores
``result.as_dict()``.

- The user is the unit of analysis (users are what is randomised). Every metric is a ratio of
  per-user sums, Σ numerator / Σ denominator, with delta-method variance over users.
- Each comparison reports the absolute and relative lift with fixed-horizon (1 − α) intervals
  and z-test p-values, and an always-valid confidence sequence and p-value for the absolute
  lift. Decisions use only the always-valid inference, so the page may be watched and the
  decision re-run at every look without inflating false positives.
- A sample-ratio-mismatch check blocks every decision.

Why the asymptotic confidence sequence (Waudby-Smith et al. 2023, as in GrowthBook) and not the
normal-mixture mSPRT (Johari, Pekelis & Walsh): both rest on the same Gaussian-mixture martingale,
but the mSPRT's mixing variance τ² lives on the effect's own scale (reward units, a rate, a share
of slow requests), so one τ² cannot serve six metrics, and a badly scaled τ² costs power with no
warning. The confidence sequence is scaled by the estimated standard deviation and tuned by N*,
a sample size that means the same for every metric. It also yields the interval the page shows
directly, its coverage comes with a time-uniform central limit theorem for any metric with a
consistent variance estimate (our delta-method ratios included), and its numbers can be checked
against a widely used implementation.
"""

from .analysis import analyze, enough_effective_users, metric_roles
from .config import ExperimentConfig
from .decision import ACTIONS, BLOCKED_SRM, INCONCLUSIVE, KEEP_RUNNING, PROMOTE, ROLLBACK
from .metrics import (
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    METRICS,
    ArmData,
    MetricDefinition,
    count_slow_requests,
    pooled_p95,
    slow_request_threshold,
)
from .results import Decision, ExperimentAnalysis, MetricResult, SrmResult

__all__ = [
    "ACTIONS",
    "BLOCKED_SRM",
    "HIGHER_IS_BETTER",
    "INCONCLUSIVE",
    "KEEP_RUNNING",
    "LOWER_IS_BETTER",
    "METRICS",
    "PROMOTE",
    "ROLLBACK",
    "ArmData",
    "Decision",
    "ExperimentAnalysis",
    "ExperimentConfig",
    "MetricDefinition",
    "MetricResult",
    "SrmResult",
    "analyze",
    "count_slow_requests",
    "enough_effective_users",
    "metric_roles",
    "pooled_p95",
    "slow_request_threshold",
]
