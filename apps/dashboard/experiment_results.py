"""What the experiment page shows, read from the statistics the snapshots stored.

The page never recomputes the statistics: ``experiment_snapshot_take`` (beat, every minute) stores
``analyze(...).as_dict()``, and this module shapes the latest one for the template, side by side
per arm, with the primary metric's lift over time taken from the earlier snapshots. The only live
count is the exposures per arm, so a page opened between snapshots shows who has arrived since.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.utils.safestring import SafeString

from apps.adapters.models import Adapter
from apps.dashboard import charts
from apps.experiments.models import (
    CANDIDATE,
    CONTROL,
    Experiment,
    ExperimentArmCount,
    ExperimentSnapshot,
    HoldoutSnapshot,
)
from apps.experiments.selectors import experiment_latest_snapshot
from apps.experiments.stats import METRICS, PROMOTE, ROLLBACK

# Metrics that are shares of requests or of shown suggestions read best as percentages.
PERCENT_METRICS = frozenset(METRICS) - {"reward_per_request", "retained_chars_per_request"}
LIFT_POINTS = 120  # snapshots drawn in the lift-over-time chart, evenly thinned

ACTION_LABELS = {
    "promote": "Promote the candidate",
    "rollback": "Roll the candidate back",
    "keep_running": "Keep running",
    "inconclusive": "Inconclusive",
    "blocked_srm": "Blocked: sample ratio mismatch",
}


def _fmt(metric: str) -> Any:
    if metric in PERCENT_METRICS:
        return lambda v: f"{v * 100:+.1f} pp" if v else "0"
    return charts.format_number


@dataclass
class MetricRow:
    name: str
    label: str
    role: str
    percent: bool
    control: float | None
    candidate: float | None
    abs_lift: float | None
    rel_lift: float | None
    interval: list[float] | None
    fixed_interval: list[float] | None
    p_always_valid: float | None
    p_fixed: float | None
    direction: str
    polarity: str
    bar: SafeString
    adjusted: dict[str, Any] | None = None
    """The lift adjusted by users' pre-exposure behaviour: abs_lift, interval, p_always_valid,
    variance_reduction, users_with_history (None: the snapshot has no adjustment)."""
    effective_users: list[float | None] | None = None
    """(control, candidate) Kish effective users by the metric's denominator (older snapshots: None)."""
    too_few_effective_users: bool = False
    """Below the experiment's ``min_effective_users_per_arm``: no always-valid inference yet."""


@dataclass
class ExperimentResults:
    experiment: Experiment
    snapshot: ExperimentSnapshot | None
    exposures_now: dict[str, int]
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: list[MetricRow] = field(default_factory=list)
    srm: dict[str, Any] = field(default_factory=dict)
    decision: dict[str, str] = field(default_factory=dict)
    lift_chart: SafeString | None = None
    primary_label: str = ""

    @property
    def users_with_history(self) -> int | None:
        """Users whose history adjusted the lifts (None: no adjustment in this snapshot)."""
        adjusted = next((m.adjusted for m in self.metrics if m.adjusted is not None), None)
        return adjusted.get("users_with_history") if adjusted is not None else None

    @property
    def history_unused(self) -> bool:
        """Users with history, but too few to fit a covariate: the adjusted lift is the unadjusted one
        (snapshots taken before the count was recorded say nothing of it: False)."""
        adjusted = next((m.adjusted for m in self.metrics if m.adjusted is not None), None)
        return bool(adjusted and adjusted.get("users_with_history") and adjusted.get("covariates_fitted") == 0)

    @property
    def decision_label(self) -> str:
        return ACTION_LABELS.get(self.decision.get("action", ""), self.decision.get("action", ""))

    @property
    def shares(self) -> dict[str, float]:
        """The configured split, known before any user arrives."""
        weight = self.experiment.candidate_weight
        return {CONTROL: 1 - weight, CANDIDATE: weight}

    @property
    def recommends(self) -> str:
        """``promote`` / ``rollback`` when the statistics say so, else ``""``."""
        action = self.decision.get("action", "")
        return action if action in (PROMOTE, ROLLBACK) else ""

    @property
    def primary(self) -> MetricRow | None:
        return next((m for m in self.metrics if m.role == "primary"), None)

    @property
    def guardrails(self) -> list[MetricRow]:
        return [m for m in self.metrics if m.role == "guardrail"]


def exposures_per_arm(experiment: Experiment) -> dict[str, int]:
    """Users exposed in each arm now: the counts the database keeps as exposures are written
    (``ExperimentArmCount``), not a count of the exposures (a million rows at a year's size)."""
    counts = {CONTROL: 0, CANDIDATE: 0}
    counts.update(ExperimentArmCount.objects.filter(experiment_id=experiment.pk).values_list("arm", "exposures"))
    return counts


def _metric_row(m: dict[str, Any], config: dict[str, Any]) -> MetricRow:
    interval = (m.get("ci_always_valid") or {}).get("abs")
    effective = m.get("effective_users")
    minimum = config.get("min_effective_users_per_arm")
    too_few = effective is not None and minimum is not None and any(e is None or e < minimum for e in effective)
    lift = m.get("abs_lift")
    fmt = _fmt(m["name"])
    adjusted = m.get("adjusted")
    if adjusted is not None:
        adjusted = dict(adjusted, interval=(adjusted.get("ci_always_valid") or {}).get("abs"))
    # The bar draws what decides: where the arms carry covariates the adjusted lift and interval alone
    # decide (and colour it), so the band that "leaves zero" is that one, never the unadjusted one.
    bar_lift, bar_interval = (
        (adjusted.get("abs_lift"), adjusted["interval"]) if adjusted is not None else (lift, interval)
    )
    which = "adjusted lift" if adjusted is not None else "lift"
    label = f"{m['label']}: {which} {fmt(bar_lift) if bar_lift is not None else 'not testable'}"
    if bar_interval:
        label += f", always-valid interval {fmt(bar_interval[0])} to {fmt(bar_interval[1])}"
    return MetricRow(
        name=m["name"],
        label=m["label"],
        role=m["role"],
        percent=m["name"] in PERCENT_METRICS,
        control=m.get("control"),
        candidate=m.get("candidate"),
        abs_lift=lift,
        rel_lift=m.get("rel_lift"),
        interval=interval,
        fixed_interval=(m.get("ci_fixed") or {}).get("abs"),
        p_always_valid=m.get("p_always_valid"),
        p_fixed=m.get("p_fixed"),
        direction=m.get("direction", "none"),
        polarity=m.get("polarity", ""),
        adjusted=adjusted,
        effective_users=effective,
        too_few_effective_users=too_few,
        bar=charts.lift_bar(
            bar_interval[0] if bar_interval else None,
            bar_lift,
            bar_interval[1] if bar_interval else None,
            kind=m.get("direction", "none"),
            title=label,
            x_format=fmt,
        ),
    )


@dataclass
class HoldoutResults:
    """The adapter's lineage (production, whichever version) against its holdout on the base model."""

    share: float
    snapshot: HoldoutSnapshot | None
    metrics: list[MetricRow] = field(default_factory=list)
    users: dict[str, int] = field(default_factory=dict)


def holdout_results(adapter: Adapter, snapshot: HoldoutSnapshot | None) -> HoldoutResults | None:
    """None for an adapter without a holdout; the stored comparison's rows otherwise."""
    if adapter.holdout_share <= 0:
        return None
    results = HoldoutResults(share=adapter.holdout_share, snapshot=snapshot)
    if snapshot is not None:
        arms = snapshot.analysis.get("arms", {})
        results.users = {arm: (arms.get(arm) or {}).get("users", 0) for arm in (CONTROL, CANDIDATE)}
        config = snapshot.analysis.get("config") or {}
        results.metrics = [_metric_row(m, config) for m in snapshot.analysis.get("metrics", [])]
    return results


def lift_over_time(experiment: Experiment, metric: str) -> list[charts.BandPoint]:
    """The metric's lift and always-valid interval at each snapshot (at most LIFT_POINTS, evenly
    spread): two queries, the second reading only the chosen snapshots' JSON."""
    stamps = list(experiment.snapshots.order_by("computed_at", "id").values_list("pk", "computed_at"))
    if len(stamps) > LIFT_POINTS:
        step = (len(stamps) - 1) / (LIFT_POINTS - 1)
        stamps = [stamps[round(i * step)] for i in range(LIFT_POINTS)]
    analyses = dict(
        ExperimentSnapshot.objects.filter(pk__in=[pk for pk, _ in stamps]).values_list("pk", "analysis__metrics")
    )
    points = []
    for pk, computed_at in stamps:
        row = next((m for m in analyses.get(pk) or [] if m.get("name") == metric), None)
        if row is None:
            continue
        row = row.get("adjusted") or row  # what decided at that look (the adjusted lift, where fitted)
        interval = (row.get("ci_always_valid") or {}).get("abs") or [None, None]
        points.append(charts.BandPoint(x=computed_at, estimate=row.get("abs_lift"), low=interval[0], high=interval[1]))
    return points


def _time_format(points: list[charts.BandPoint]) -> Any:
    """Labels as fine as the chart's span needs: seconds within minutes, days past a day."""
    span = 0.0
    if len(points) > 1:
        first: Any = points[0].x  # a datetime on these charts
        span = (points[-1].x - first).total_seconds()
    pattern = "%H:%M:%S" if span < 600 else "%H:%M" if span < 86400 else "%d %b %H:%M"
    return lambda moment: moment.strftime(pattern)


def experiment_results(experiment: Experiment, *, with_history: bool = True) -> ExperimentResults:
    snapshot = experiment_latest_snapshot(experiment)
    results = ExperimentResults(experiment=experiment, snapshot=snapshot, exposures_now=exposures_per_arm(experiment))
    primary_name = (experiment.config or {}).get("primary_metric", "reward_per_request")
    results.primary_label = METRICS[primary_name].label if primary_name in METRICS else primary_name
    if snapshot is not None:
        analysis = snapshot.analysis
        results.arms = analysis.get("arms", {})
        results.metrics = [_metric_row(m, analysis.get("config") or {}) for m in analysis.get("metrics", [])]
        results.srm = analysis.get("srm", {})
        results.decision = analysis.get("decision", {})
    if with_history:
        points = lift_over_time(experiment, primary_name)
        results.lift_chart = charts.band_chart(
            points,
            title=f"Lift of {results.primary_label} over time (UTC), with its always-valid band",
            x_format=_time_format(points),
            y_format=_fmt(primary_name),
        )
    return results
