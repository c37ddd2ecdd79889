"""What a lineage of promotions did for users: its lift against the adapter's holdout (users kept
on the base model across every promotion), and alarms on a promoted version that learned to show
less (reward hacking: a version that stays silent can look better on accept rate of shown).

Run by beat every minute with the experiments' snapshots; pages read what is stored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.common.exceptions import ApplicationError, Conflict, ValidationFailed
from apps.experiments.lineage_data import UserSums, adapter_traffic, holdout_and_lineage, user_sums
from apps.experiments.models import HoldoutSnapshot, PromotionAlarm, PromotionWatch
from apps.experiments.selectors import experiment_running_for
from apps.experiments.services.production import adapter_rollback
from apps.experiments.stats import ExperimentConfig, analyze, enough_effective_users, inference
from apps.experiments.stats.results import finite_or_none
from apps.notifications.services import notification_send
from apps.tenants.models import AuditEvent, Tenant
from apps.tenants.services import audit_record

logger = logging.getLogger(__name__)

HOLDOUT_WINDOW = timedelta(days=28)
"""The holdout's lift reads the adapter's traffic of this long."""
HOLDOUT_EVERY = timedelta(minutes=10)
"""Beat recomputes an adapter's holdout lift at most this often; only the latest is kept."""
ALARM_WINDOW = timedelta(days=7)
"""A promotion is watched this long; the version before it is read over this long before it."""
ALARM_BOUND = 0.3
"""An alarm needs the version's value this share below the reference's (and the always-valid
interval of the difference below zero)."""
ALARM_MIN_USERS = 20
"""Users each side needs before any alarm."""
ALARM_N_STAR = 500.0
"""Tuning sample size of the alarms' confidence sequence (users, both sides)."""
ALARM_CONFIG = ExperimentConfig(n_star=ALARM_N_STAR, min_users_per_arm=ALARM_MIN_USERS)
"""The experiments' rules the alarms share: α, N* and the minimum of effective users a side
(``min_effective_users_per_arm``): an alarm, like a decision, never rests on a few heavy users."""
HOLDOUT_METRICS = ("accept_rate", "accepted_per_request", "suggestion_rate")


@dataclass(frozen=True)
class AlarmMetric:
    """Σ numerator / Σ denominator per user (``lineage_data.UserSums`` columns); lower is worse."""

    name: str
    label: str
    numerator: str
    denominator: str


ALARM_METRICS: list[AlarmMetric] = [
    AlarmMetric("suggestion_rate", "suggestions shown per request", "shown", "requests"),
    AlarmMetric("suggestion_length", "characters per suggestion shown", "shown_chars", "shown"),
    AlarmMetric("retained_chars_per_request", "retained characters per request", "retained_chars", "settled_requests"),
]


def adapter_holdout_set(tenant: Tenant, *, adapter: Adapter, share: float, actor: str) -> Adapter:
    """Set the share of the adapter's opted-in users kept on the base model (0: no holdout); audited.
    Not while an experiment runs on the adapter: a larger holdout would move users it exposed out of
    their arm (the holdout is read before the experiment), and a user's arm never moves."""
    if not (0 <= share <= 0.5):
        raise ValidationFailed("share: must be between 0 and 0.5", details={"field": "share"})
    with transaction.atomic():
        before = Adapter.objects.select_for_update(no_key=True).get(pk=adapter.pk, tenant=tenant).holdout_share
        running = experiment_running_for(adapter)  # under the adapter's lock, which a start takes too
        if running is not None and share != before:
            raise Conflict(
                f"experiment {running.pk} is running on {adapter.name}: a new holdout would move users it exposed "
                "out of their arm; change it once the experiment has ended",
                code="experiment_running",
            )
        Adapter.objects.filter(pk=adapter.pk).update(holdout_share=share)
        audit_record(
            tenant,
            actor=actor,
            action="adapter.holdout",
            target_type="adapter",
            target_id=adapter.name,
            data={"before": before, "after": share},
        )
    adapter.holdout_share = share
    return adapter


def holdout_snapshot_take(adapter: Adapter) -> HoldoutSnapshot | None:
    """The lineage (production, whichever version) against the holdout over ``HOLDOUT_WINDOW``."""
    if adapter.holdout_share <= 0:
        return None
    since = timezone.now() - HOLDOUT_WINDOW
    holdout, lineage = holdout_and_lineage(adapter, adapter_traffic(adapter).filter(served_at__gte=since))
    config = ExperimentConfig(
        weights=(adapter.holdout_share, 1 - adapter.holdout_share),
        secondary_metrics=HOLDOUT_METRICS,
        guardrails=(),
        min_users_per_arm=0,
        n_star=ALARM_N_STAR,
    )
    analysis = analyze(holdout.arm(), lineage.arm(), config=config, elapsed=HOLDOUT_WINDOW)
    with transaction.atomic():
        snapshot = HoldoutSnapshot.objects.create(
            tenant_id=adapter.tenant_id,
            adapter=adapter,
            computed_at=timezone.now(),
            users=len(holdout.users) + len(lineage.users),
            analysis=analysis.as_dict(),
        )
        # The page reads the latest alone: the table stays one row per adapter.
        HoldoutSnapshot.objects.filter(adapter=adapter).exclude(pk=snapshot.pk).delete()
    return snapshot


@dataclass(frozen=True)
class MetricWatch:
    """One watched metric at one check: whether its alarm fires and, when it cannot, why."""

    metric: AlarmMetric
    status: str
    users: tuple[int, int]
    """(reference, version)."""
    effective_users: tuple[float | None, float | None]
    """Kish's effective users by the metric's denominator (``inference.effective_users``)."""
    observed: float | None
    reference_value: float | None
    relative_change: float | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric.name,
            "label": self.metric.label,
            "status": self.status,
            "users": list(self.users),
            "effective_users": list(self.effective_users),
            "observed": self.observed,
            "reference_value": self.reference_value,
            "relative_change": self.relative_change,
            "reason": self.reason,
        }


_COUNTED = {"requests": "requests", "shown": "suggestions shown"}


def _watch(
    metric: AlarmMetric, current: UserSums, reference: UserSums, *, version: str, adapter: str, against: str
) -> MetricWatch:
    """Whether ``current`` (``version``'s traffic since its promotion, "v2") fell beyond the bound
    against ``reference`` (``against``: "the holdout (base model)", "v1"). Below the minimum of
    users, or of effective users by the metric's denominator (the experiments' rule,
    ``ALARM_CONFIG``), on either side: no alarm, and the reason says why."""
    a, b = _moments(reference, metric), _moments(current, metric)
    ref, now = finite_or_none(inference.ratio_estimate(a)), finite_or_none(inference.ratio_estimate(b))
    change = (now - ref) / ref if ref is not None and now is not None and ref > 0 else None
    users = (len(reference.users), len(current.users))
    effective = (finite_or_none(inference.effective_users(a)), finite_or_none(inference.effective_users(b)))

    def watched(status: str, reason: str) -> MetricWatch:
        return MetricWatch(metric, status, users, effective, now, ref, change, reason)

    if min(users) < ALARM_MIN_USERS:
        return watched(
            PromotionWatch.Status.TOO_FEW_USERS,
            f"Too few users: {users[0]:,} for {against}, {users[1]:,} for {version} (minimum {ALARM_MIN_USERS} a "
            "side); no alarm yet.",
        )
    if ref is None or now is None:
        side = against if ref is None else version
        return watched(PromotionWatch.Status.NOT_TESTABLE, f"Not testable: {side} has no {metric.label} yet.")
    if not enough_effective_users(list(effective), ALARM_CONFIG):
        return watched(
            PromotionWatch.Status.TOO_FEW_EFFECTIVE_USERS,
            f"Too few effective users: {effective[0]:,.1f} for {against}, {effective[1]:,.1f} for {version}, "
            f"weighting each user by their {_COUNTED.get(metric.denominator, metric.denominator)} (minimum "
            f"{ALARM_CONFIG.min_effective_users_per_arm} a side, as for an experiment's decision): a few heavy users "
            "make most of the traffic, and no alarm rests on them.",
        )
    se = float(np.sqrt(inference.ratio_variance(a) + inference.ratio_variance(b)))
    if change is None or not np.isfinite(se):
        return watched(PromotionWatch.Status.NOT_TESTABLE, f"Not testable: {against} shows no {metric.label}.")
    half = float(inference.always_valid_half_width(se, a.n + b.n, ALARM_CONFIG.alpha, ALARM_CONFIG.n_star))
    if change <= -ALARM_BOUND and now - ref + half < 0:
        return watched(
            PromotionWatch.Status.ALARM,
            f"{version} of {adapter} shows {metric.label} {now:.3g} since its promotion against {ref:.3g} for "
            f"{against}: {change:+.0%}, beyond the {ALARM_BOUND:.0%} bound, and significant. A version that learns "
            "to show less can look better on accept rate of shown while users get less.",
        )
    return watched(
        PromotionWatch.Status.NO_ALARM,
        f"No alarm: {now:.3g} for {version} against {ref:.3g} for {against} ({change:+.0%}); an alarm needs a fall "
        f"of {ALARM_BOUND:.0%} or more with the always-valid interval of the difference below zero.",
    )


def _promotion(adapter: Adapter) -> tuple[AdapterVersion, AdapterVersion | None, AuditEvent] | None:
    """The production version, the one before it and the audit row of its promotion, when
    production moved forward within ``ALARM_WINDOW``."""
    version = adapter.production_version
    if version is None:
        return None
    event = (
        AuditEvent.objects.filter(
            tenant_id=adapter.tenant_id,
            action="adapter.promote",
            target_type="adapter",
            target_id=adapter.name,
            data__to=version.vllm_name,
            created_at__gte=timezone.now() - ALARM_WINDOW,
        )
        .order_by("-created_at")
        .first()
    )
    if event is None:
        return None
    previous = AdapterVersion.objects.filter(adapter=adapter, vllm_name=event.data.get("from") or "").first()
    if previous is not None and previous.number > version.number:
        return None  # production moved back: a rollback is no promotion to watch
    return version, previous, event


def promotion_alarm_check(adapter: Adapter) -> list[PromotionAlarm]:
    """Raise an alarm (once per version and metric: a webhook event, an audit row, the pages'
    banner) on each ``ALARM_METRICS`` metric of the production version that fell beyond the bound
    since its promotion, against the holdout when it has the users, else against the version
    before; with the tenant's automatic rollback on, production moves back to that version.
    Every check is stored (``PromotionWatch``), with why a metric raised no alarm."""
    found = _promotion(adapter)
    if found is None:
        PromotionWatch.objects.filter(adapter=adapter).delete()
        return []
    version, previous, event = found
    traffic = adapter_traffic(adapter)
    after = traffic.filter(served_at__gte=event.created_at)
    holdout, _ = holdout_and_lineage(adapter, after)
    _, current = holdout_and_lineage(adapter, after.filter(adapter_version=version))
    reference, kind = holdout, PromotionAlarm.Reference.HOLDOUT
    if previous is not None and not _holdout_suffices(holdout):
        before = traffic.filter(
            adapter_version=previous, served_at__lt=event.created_at, served_at__gte=event.created_at - ALARM_WINDOW
        )
        reference, kind = user_sums(adapter, before), PromotionAlarm.Reference.PREVIOUS
    against = "the holdout (base model)" if kind == PromotionAlarm.Reference.HOLDOUT else f"v{previous.number}"  # type: ignore[union-attr]
    if previous is None and adapter.holdout_share <= 0:  # nothing to compare with, now or later
        reason = "Not testable: this adapter keeps no holdout (its share is 0) and has no version before this one."
        watched = [
            MetricWatch(
                m, PromotionWatch.Status.NOT_TESTABLE, (0, len(current.users)), (None, None), None, None, None, reason
            )
            for m in ALARM_METRICS
        ]
    else:
        watched = [
            _watch(m, current, reference, version=f"v{version.number}", adapter=adapter.name, against=against)
            for m in ALARM_METRICS
        ]
    raised = []
    for w in watched:
        if w.status == PromotionWatch.Status.ALARM:
            alarm = _raise(adapter, version, w, kind)
            if alarm is not None:
                raised.append(alarm)
    # The rollback before the stored check: an alarm's rows are committed once raised, so a failure
    # to store the check must not cost the rollback they call for. An alarm of this promotion whose
    # rollback was refused (vLLM down while it loaded the version before) is tried again at each
    # check; one raised before a person promoted the version again is theirs to judge, not retried.
    if adapter.tenant.experiment_auto_rollback and previous is not None:
        waiting = PromotionAlarm.objects.filter(
            adapter=adapter, version=version, rolled_back=False, created_at__gte=event.created_at
        )
        pending = raised + list(waiting.exclude(pk__in=[a.pk for a in raised]))
        if pending:
            _roll_back(adapter, version, previous, pending)
    _watch_store(adapter, version, event.created_at, kind, watched)
    return raised


def _holdout_suffices(holdout: UserSums) -> bool:
    """The holdout is the reference only when every watched metric can be judged against it: the
    users an alarm needs and, by each metric's denominator, the effective users (a holdout of a few
    heavy users would block every alarm while the version before has the traffic to judge by). A
    metric the holdout has no traffic for yet (retained characters, in the minutes after a promotion)
    decides nothing here."""
    if len(holdout.users) < ALARM_MIN_USERS:
        return False
    return all(
        enough_effective_users([finite_or_none(inference.effective_users(_moments(holdout, m)))], ALARM_CONFIG)
        for m in ALARM_METRICS
        if holdout.columns[m.denominator].any()  # none yet (retained characters settle): judged by none
    )


def _moments(sums: UserSums, metric: AlarmMetric) -> inference.RatioMoments:
    """``metric``'s per-user numerator and denominator sums as the ratio statistics read them."""
    return inference.RatioMoments.from_users(sums.columns[metric.numerator], sums.columns[metric.denominator])


def _watch_store(
    adapter: Adapter, version: AdapterVersion, promoted_at: datetime, kind: str, watched: list[MetricWatch]
) -> None:
    PromotionWatch.objects.update_or_create(
        adapter=adapter,
        defaults={
            "tenant_id": adapter.tenant_id,
            "version": version,
            "promoted_at": promoted_at,
            "reference": kind,
            "checked_at": timezone.now(),
            "metrics": [w.as_dict() for w in watched],
        },
    )


def _raise(adapter: Adapter, version: AdapterVersion, watched: MetricWatch, kind: str) -> PromotionAlarm | None:
    metric = watched.metric
    now, ref, change, reason = watched.observed, watched.reference_value, watched.relative_change, watched.reason
    if now is None or ref is None or change is None:  # an alarm is raised on figures it measured
        return None
    try:
        with transaction.atomic():
            alarm = PromotionAlarm.objects.create(
                tenant_id=adapter.tenant_id,
                adapter=adapter,
                version=version,
                metric=metric.name,
                reference=kind,
                observed=now,
                reference_value=ref,
                relative_change=change,
                reason=reason,
            )
            data = {
                "adapter": adapter.name,
                "version": version.number,
                "metric": metric.name,
                "reference": kind,
                "observed": now,
                "reference_value": ref,
                "relative_change": change,
                "reason": reason,
            }
            audit_record(
                adapter.tenant,
                actor="system",
                action="adapter.alarm",
                target_type="adapter",
                target_id=adapter.name,
                data=data,
            )
            notification_send(adapter.tenant_id, event="version.alarm", data=data)
    except IntegrityError:
        return None  # raised before, for this version and metric
    return alarm


def _roll_back(
    adapter: Adapter, version: AdapterVersion, previous: AdapterVersion, alarms: list[PromotionAlarm]
) -> None:
    """Production back from the alarmed ``version`` to ``previous``, only while ``version`` is still
    production (someone may have promoted another since this check read the adapter)."""
    try:
        adapter_rollback(adapter.tenant, adapter=adapter, to_version=previous, actor="system:alarm", only_from=version)
    except ApplicationError as exc:
        logger.warning("adapter %s: automatic rollback on alarm refused: %s", adapter.pk, exc.message)
        return
    PromotionAlarm.objects.filter(pk__in=[a.pk for a in alarms]).update(rolled_back=True)
    for alarm in alarms:
        alarm.rolled_back = True


def lineage_checks_all() -> int:
    """Beat: every adapter with a holdout gets a holdout snapshot (at most every ``HOLDOUT_EVERY``);
    every adapter promoted within ``ALARM_WINDOW`` gets its alarms checked. Returns the adapters
    checked."""
    promoted = set(
        AuditEvent.objects.filter(
            action="adapter.promote", target_type="adapter", created_at__gte=timezone.now() - ALARM_WINDOW
        ).values_list("tenant_id", "target_id")
    )
    watch = Q(holdout_share__gt=0)
    for tenant_id, name in promoted:
        watch |= Q(tenant_id=tenant_id, name=name)
    checked = 0
    for adapter in Adapter.objects.filter(watch).select_related("tenant", "production_version").order_by("pk"):
        watched = (adapter.tenant_id, adapter.name) in promoted
        checked += 1
        # One adapter's failure must not stop the others', nor its snapshot's failure its alarms.
        try:
            latest = adapter.holdout_snapshots.order_by("-computed_at").values_list("computed_at", flat=True).first()
            if adapter.holdout_share > 0 and (latest is None or timezone.now() - latest >= HOLDOUT_EVERY):
                holdout_snapshot_take(adapter)
        except Exception:
            logger.exception("holdout snapshot of adapter %s failed", adapter.pk)
        try:
            if watched:
                promotion_alarm_check(adapter)
        except Exception:
            logger.exception("alarm check of adapter %s failed", adapter.pk)
    return checked
