"""Scheduling: when an adapter's new events start a run, one run per tenant at a time on its GPU
queue, and the sweep that sends again what a lost message would have."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Min
from django.utils import timezone

from apps.adapters.models import Adapter
from apps.common.tasks import enqueue_on_commit
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record
from apps.training.models import ACTIVE_STATUSES, TrainingRun
from apps.training.selectors import adapter_lineage_head, training_events_new, training_policy_get

logger = logging.getLogger(__name__)


def gpu_queue(tenant: Tenant) -> str:
    """The queue of the tenant's training runs: its pool's (``STROP_GPU_POOLS``), else ``gpu``."""
    return settings.STROP_GPU_POOLS.get(tenant.slug, "gpu")


def _dispatch(run: TrainingRun) -> None:
    """``run.tenant`` must be loaded with it (select_related): its slug picks the queue."""
    sent = TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, status=TrainingRun.Status.QUEUED).update(
        dispatched_at=timezone.now()
    )
    if sent:  # never a message for an attempt that was claimed or requeued since it was read
        enqueue_on_commit("workers.training.training_run_execute", run.pk, run.attempt, queue=gpu_queue(run.tenant))


def tenant_dispatch_next(tenant_id: int) -> TrainingRun | None:
    """Send the tenant's oldest queued run to its gpu queue, unless one of its runs waits there.

    Fairness between tenants: a gpu queue is first in, first out, and holds at most one waiting
    run per tenant, so a tenant with many adapters or runs puts one run ahead of another tenant's,
    never all of them; any number of gpu workers take from it. A tenant in a training pool
    (``STROP_GPU_POOLS``) waits in its pool's queue, among that pool's tenants only. The next is
    sent when that one is claimed (or the reaper requeues one).
    The caller holds the tenant's row lock, so two dispatchers cannot both send one."""
    queued = TrainingRun.objects.filter(tenant_id=tenant_id, status=TrainingRun.Status.QUEUED)
    if queued.filter(dispatched_at__isnull=False).exists():
        return None
    run = queued.select_related("tenant").order_by("created_at", "id").first()
    if run is not None:
        _dispatch(run)
    return run


def tenant_lock(tenant_id: int) -> Tenant:
    return Tenant.objects.select_for_update(no_key=True).get(pk=tenant_id)


_HEAD = object()  # training_schedule's default parent: the adapter's lineage head


def training_schedule(
    adapter: Adapter, *, force: bool = False, parent: Any = _HEAD, trigger: str = "forced"
) -> TrainingRun | None:
    """Start a run for ``adapter`` if its policy says so and nothing stops it.

    At most one active run per adapter is enforced by a partial unique index (two schedulers
    racing create one run); the tenant's cap is checked under a lock on the tenant row. A forced
    run may name the version it trains from (``parent``; None: a fresh LoRA on the base).
    """
    policy = training_policy_get(adapter)
    if not policy.enabled and not force:
        return None
    if parent is _HEAD:
        parent = adapter_lineage_head(adapter)
    if not force:
        if TrainingRun.objects.filter(adapter=adapter, status__in=ACTIVE_STATUSES).exists():
            return None  # one at a time per adapter: nothing to count while it runs
        # Only events the run's window would take count: a window a run from this parent already
        # tried (rejected, failed) is not tried again because events wait behind it.
        new = training_events_new(adapter, parent=parent, limit=settings.TRAINING_MAX_WINDOW_EVENTS)
        stats = new.aggregate(count=Count("id"), oldest=Min("updated_at"))
        count = stats["count"]
        if count >= policy.min_new_events:
            trigger = f"{count} new events"
        elif count and stats["oldest"] and timezone.now() - stats["oldest"] >= timedelta(seconds=policy.max_wait_s):
            trigger = f"{count} events waited {policy.max_wait_s} s"
        else:
            return None
    try:
        with transaction.atomic():
            tenant = tenant_lock(adapter.tenant_id)
            active = TrainingRun.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES).count()
            if active >= tenant.max_concurrent_training_runs:
                return None
            run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, parent_version=parent, trigger=trigger)
            tenant_dispatch_next(tenant.pk)
    except IntegrityError:
        return None  # another scheduler created this adapter's active run first
    logger.info("scheduled training run %s for %s (%s)", run.pk, adapter, trigger)
    return run


def training_run_start(tenant: Tenant, *, adapter: Adapter, actor: str) -> TrainingRun | None:
    """A person starts a run now, whatever the policy says; audited. None: one is already going
    for this adapter, or the tenant is at its cap."""
    if adapter.tenant_id != tenant.pk:
        raise ValueError("adapter belongs to another tenant")
    with transaction.atomic():
        run = training_schedule(adapter, force=True)
        if run is not None:
            audit_record(
                tenant,
                actor=actor,
                action="training_run.start",
                target_type="training_run",
                target_id=str(run.pk),
                data={"adapter": adapter.name, "parent": run.parent_version.vllm_name if run.parent_version else None},
            )
    return run


def training_schedule_tenant(tenant_id: int) -> list[TrainingRun]:
    adapters = Adapter.objects.filter(tenant_id=tenant_id).select_related("tenant")
    return [run for adapter in adapters if (run := training_schedule(adapter)) is not None]


def training_schedule_all() -> list[TrainingRun]:
    tenant_ids = Adapter.objects.values_list("tenant_id", flat=True).distinct()
    return [run for tenant_id in tenant_ids for run in training_schedule_tenant(tenant_id)]


def _gpu_queue_length(queue: str) -> int | None:
    """Messages waiting in the broker's gpu queue ``queue`` (None: the broker cannot say)."""
    from celery import current_app

    try:
        with current_app.connection_for_read() as connection:
            return int(connection.default_channel.queue_declare(queue=queue, passive=True).message_count)
    except Exception as exc:  # any transport's error: then every run waiting past the cutoff is sent again
        logger.info("the %s queue's length is unknown (%s); resending every run waiting past the cutoff", queue, exc)
        return None


def training_sweep_queued(*, older_than_s: int = 60) -> list[int]:
    """Send queued runs again whose message the broker lost (Redis restarted), and the first run of
    a tenant whose queued runs have none sent.

    Postgres is the record; a second message for the same attempt finds the run claimed and
    does nothing."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    queued = TrainingRun.objects.filter(status=TrainingRun.Status.QUEUED)
    sent = queued.filter(dispatched_at__isnull=False).select_related("tenant").order_by("dispatched_at", "id")
    # A run may wait long behind other tenants' runs: it is sent again only when its gpu queue (the
    # tenant's pool's, or gpu) holds fewer messages than runs sent to it and waiting (the broker lost
    # some), the longest waiting first.
    by_queue: dict[str, list[TrainingRun]] = {}
    for run in sent:
        by_queue.setdefault(gpu_queue(run.tenant), []).append(run)
    runs: list[TrainingRun] = []
    for queue, waiting in by_queue.items():
        in_queue = _gpu_queue_length(queue)
        lost = len(waiting) - in_queue if in_queue is not None else None
        if lost is None or lost > 0:
            overdue = [run for run in waiting if run.dispatched_at is not None and run.dispatched_at < cutoff]
            runs.extend(overdue if lost is None else overdue[:lost])
    for run in runs:
        _dispatch(run)  # outside a transaction, on_commit sends at once
    # A tenant whose queued runs wait with none of them sent (a dispatch lost with its transaction).
    stalled = queued.filter(created_at__lt=cutoff).values_list("tenant_id", flat=True).distinct()
    for tenant_id in set(stalled) - {run.tenant_id for run in runs}:
        with transaction.atomic():
            tenant_lock(tenant_id)
            next_run = tenant_dispatch_next(tenant_id)
        if next_run is not None:
            runs.append(next_run)
    return [run.pk for run in runs]
