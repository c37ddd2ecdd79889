from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from django.db.models import QuerySet
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.common.exceptions import NotFound
from apps.common.parsing import parse_id
from apps.experiments.models import (
    Experiment,
    ExperimentExposure,
    ExperimentSnapshot,
    HoldoutSnapshot,
    PromotionAlarm,
    PromotionWatch,
)
from apps.tenants.models import Tenant


def experiment_running_for(adapter: Adapter) -> Experiment | None:
    """The adapter's running experiment (at most one: a database constraint), with its versions."""
    return (
        Experiment.objects.filter(adapter=adapter, status=Experiment.Status.RUNNING)
        .select_related("control_version", "candidate_version")
        .first()
    )


def experiment_list(tenant: Tenant, *, adapter: Adapter | None = None) -> QuerySet[Experiment]:
    experiments = Experiment.objects.filter(tenant=tenant).select_related(
        "adapter", "control_version", "candidate_version"
    )
    if adapter is not None:
        experiments = experiments.filter(adapter=adapter)
    return experiments.order_by("-created_at", "-id")


def experiment_get_for_tenant(tenant: Tenant, *, experiment_id: int | str) -> Experiment:
    try:
        return experiment_list(tenant).get(pk=parse_id(experiment_id, what="experiment"))
    except Experiment.DoesNotExist:
        raise NotFound(f"experiment {experiment_id} not found") from None


def experiment_latest_snapshot(experiment: Experiment) -> ExperimentSnapshot | None:
    return experiment.snapshots.order_by("-computed_at", "-id").first()


def holdout_latest_snapshot(adapter: Adapter) -> HoldoutSnapshot | None:
    """The latest stored comparison of the adapter's lineage with its holdout (None without one)."""
    if adapter.holdout_share <= 0:
        return None
    return adapter.holdout_snapshots.order_by("-computed_at", "-id").first()


def alarms_recent(tenant: Tenant, *, adapter: Adapter, days: int = 7) -> QuerySet[PromotionAlarm]:
    """The adapter's alarms of the last ``days`` days, newest first, with their versions."""
    since = timezone.now() - timedelta(days=days)
    return (
        PromotionAlarm.objects.filter(tenant=tenant, adapter=adapter, created_at__gte=since)
        .select_related("version")
        .order_by("-created_at")
    )


def promotion_watch_current(adapter: Adapter, *, days: int = 7) -> PromotionWatch | None:
    """The latest alarm check of the adapter's production version, while its promotion (of the
    last ``days`` days) is watched; None otherwise (never promoted, rolled back, past the window)."""
    since = timezone.now() - timedelta(days=days)
    return (
        PromotionWatch.objects.filter(adapter=adapter, version_id=adapter.production_version_id, promoted_at__gte=since)
        .select_related("version")
        .first()
    )


def experiment_snapshots(experiment: Experiment) -> QuerySet[ExperimentSnapshot]:
    return experiment.snapshots.order_by("computed_at", "id")


def experiment_arms_of_logged(tenant: Tenant, items: Sequence[tuple[str, str]]) -> list[tuple[int, str] | None]:
    """For interactions logged by a tenant that serves elsewhere, as (model, end user id): the
    running experiment and arm each belongs to, when its user was exposed (through the
    assignment endpoint) to the running experiment of the adapter ``model`` names, by its name or
    a version's vLLM name (as the assignment endpoint answers it); a ``model`` naming no adapter
    goes to the default adapter, as training attributes it. One query when nothing runs, the
    common case."""
    running = list(Experiment.objects.filter(tenant=tenant, status=Experiment.Status.RUNNING).select_related("adapter"))
    if not running:
        return [None] * len(items)
    by_adapter = {experiment.adapter.name: experiment for experiment in running}
    default = next((e for e in running if e.adapter.is_default), None)
    named = {model for model, _ in items if model}
    adapters = set(Adapter.objects.filter(tenant=tenant, name__in=named).values_list("name", flat=True))
    version_of = dict(
        AdapterVersion.objects.filter(adapter__tenant=tenant, vllm_name__in=named - adapters).values_list(
            "vllm_name", "adapter__name"
        )
    )
    users = {user for _, user in items if user}
    exposed = {
        (row["experiment_id"], row["end_user__external_id"]): row["arm"]
        for row in ExperimentExposure.objects.filter(experiment__in=running, end_user__external_id__in=users).values(
            "experiment_id", "end_user__external_id", "arm"
        )
    }
    out: list[tuple[int, str] | None] = []
    for model, user in items:
        name = version_of.get(model, model)
        # Another adapter's interaction (with no experiment running) is in none: never the default's.
        experiment = by_adapter.get(name) if name in adapters or model in version_of else default
        arm = exposed.get((experiment.pk, user)) if experiment is not None and user else None
        out.append((experiment.pk, arm) if experiment is not None and arm is not None else None)
    return out
