"""What a lineage of promotions did for users: its lift against the adapter's holdout (users kept
on the base model across every promotion), and alarms on a promoted version that learned to show
less (reward hacking: a version that stays silent can look better on accept rate of shown).

Run by beat every minute with the experiments' snapshots; pages read what is stored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.common.exceptions import ApplicationError, ValidationFailed
from apps.experiments.lineage_data import UserSums, adapter_traffic, holdout_and_lineage, user_sums
from apps.experiments.models import HoldoutSnapshot, PromotionAlarm
from apps.experiments.services.production import adapter_rollback
from apps.experiments.stats import ExperimentConfig, analyze, inference
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
    # Retained characters per request joins here once its per-user column exists:
    # lineage_data.alarm_column_register("retained_chars", ...) and
    # ALARM_METRICS.append(AlarmMetric("retained_chars_per_request", ..., "retained_chars", "requests")).
]


def adapter_holdout_set(tenant: Tenant, *, adapter: Adapter, share: float, actor: str) -> Adapter:
    """Set the share of the adapter's opted-in users kept on the base model (0: no holdout); audited."""
    if not (0 <= share <= 0.5):
        raise ValidationFailed("share: must be between 0 and 0.5", details={"field": "share"})
    with transaction.atomic():
        before = Adapter.objects.select_for_update(no_key=True).get(pk=adapter.pk, tenant=tenant).holdout_share
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


def _dropped(metric: AlarmMetric, version: UserSums, reference: UserSums) -> tuple[float, float, float] | None:
    """(version's value, reference's, relative change) when the version fell beyond the bound."""
    if min(len(version.users), len(reference.users)) < ALARM_MIN_USERS:
        return None
    a = inference.RatioMoments.from_users(reference.columns[metric.numerator], reference.columns[metric.denominator])
    b = inference.RatioMoments.from_users(version.columns[metric.numerator], version.columns[metric.denominator])
    ref, now = float(inference.ratio_estimate(a)), float(inference.ratio_estimate(b))
    se = float(np.sqrt(inference.ratio_variance(a) + inference.ratio_variance(b)))
    if not (np.isfinite(ref) and np.isfinite(now) and ref > 0 and np.isfinite(se)):
        return None
    half = float(inference.always_valid_half_width(se, a.n + b.n, 0.05, ALARM_N_STAR))
    change = (now - ref) / ref
    return (now, ref, change) if change <= -ALARM_BOUND and now - ref + half < 0 else None


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
    before; with the tenant's automatic rollback on, production moves back to that version."""
    found = _promotion(adapter)
    if found is None:
        return []
    version, previous, event = found
    traffic = adapter_traffic(adapter)
    after = traffic.filter(served_at__gte=event.created_at)
    holdout, _ = holdout_and_lineage(adapter, after)
    _, current = holdout_and_lineage(adapter, after.filter(adapter_version=version))
    reference, kind = holdout, PromotionAlarm.Reference.HOLDOUT
    if len(holdout.users) < ALARM_MIN_USERS:
        if previous is None:
            return []
        before = traffic.filter(
            adapter_version=previous, served_at__lt=event.created_at, served_at__gte=event.created_at - ALARM_WINDOW
        )
        reference, kind = user_sums(adapter, before), PromotionAlarm.Reference.PREVIOUS
    raised = []
    for metric in ALARM_METRICS:
        dropped = _dropped(metric, current, reference)
        if dropped is not None:
            alarm = _raise(adapter, version, metric, kind, previous, *dropped)
            if alarm is not None:
                raised.append(alarm)
    if raised and adapter.tenant.experiment_auto_rollback and previous is not None:
        _roll_back(adapter, previous, raised)
    return raised


def _raise(
    adapter: Adapter,
    version: AdapterVersion,
    metric: AlarmMetric,
    kind: str,
    previous: AdapterVersion | None,
    now: float,
    ref: float,
    change: float,
) -> PromotionAlarm | None:
    against = "the holdout (base model)" if kind == PromotionAlarm.Reference.HOLDOUT else f"v{previous.number}"  # type: ignore[union-attr]
    reason = (
        f"v{version.number} of {adapter.name} shows {metric.label} {now:.3g} since its promotion against {ref:.3g} "
        f"for {against}: {change:+.0%}, beyond the {ALARM_BOUND:.0%} bound, and significant. A version that learns "
        "to show less can look better on accept rate of shown while users get less."
    )
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


def _roll_back(adapter: Adapter, previous: AdapterVersion, alarms: list[PromotionAlarm]) -> None:
    try:
        adapter_rollback(adapter.tenant, adapter=adapter, to_version=previous, actor="system:alarm")
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
        try:
            latest = adapter.holdout_snapshots.order_by("-computed_at").values_list("computed_at", flat=True).first()
            if adapter.holdout_share > 0 and (latest is None or timezone.now() - latest >= HOLDOUT_EVERY):
                holdout_snapshot_take(adapter)
            if watched:
                promotion_alarm_check(adapter)
        except Exception:  # one adapter's failure must not stop the others'
            logger.exception("lineage check of adapter %s failed", adapter.pk)
    return checked
