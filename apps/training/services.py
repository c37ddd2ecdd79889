"""Scheduling and the life of a training run. Every transition is a guarded UPDATE, so a task
delivered twice, a reaper and a worker coming back from the dead cannot both move one run."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Min, Value
from django.db.models.functions import Concat
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.common.exceptions import ValidationFailed
from apps.common.parsing import json_problem
from apps.common.tasks import enqueue_on_commit
from apps.notifications.services import notification_send
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record
from apps.training.models import ACTIVE_STATUSES, REWARD_FIELDS, EvalSet, TrainingPolicy, TrainingRun
from apps.training.overrides import overrides_checked
from apps.training.selectors import adapter_lineage_head, training_events_new, training_policy_get

logger = logging.getLogger(__name__)

POLICY_FIELDS = {
    "enabled": bool,
    "min_new_events": int,
    "max_wait_s": int,
    "heldout_fraction": float,
    **dict.fromkeys(REWARD_FIELDS.values(), float),
    "auto_experiment": bool,
    "show_gate": bool,
    "show_gate_recall": float,
    "show_gate_explore": float,
    "trainer_overrides": dict,
    "gate_overrides": dict,
}

# Bounds of the numeric policy fields: what the database column holds and what a run can use.
POLICY_RANGES: dict[str, tuple[float, float]] = {
    "min_new_events": (1, 1_000_000),
    "max_wait_s": (0, 366 * 24 * 3600),
    **dict.fromkeys(REWARD_FIELDS.values(), (-10.0, 10.0)),
    "show_gate_recall": (0.5, 1.0),
    "show_gate_explore": (0.0, 1.0),
}


def training_policy_update(tenant: Tenant, *, adapter: Adapter, actor: str, changes: dict[str, Any]) -> TrainingPolicy:
    policy = training_policy_get(adapter)
    for name, value in changes.items():
        problem = json_problem(value, name)  # before anything walks it: overrides are free-form JSON
        if problem is not None:
            raise ValidationFailed(f"{problem[0]}: {problem[1]}")
        kind = POLICY_FIELDS.get(name)
        if kind is None:
            raise ValidationFailed(f"{name}: not a training policy field ({', '.join(POLICY_FIELDS)})")
        if kind is float and type(value) is int:
            value = float(value)
        if type(value) is not kind:
            raise ValidationFailed(f"{name}: must be {kind.__name__}")
        setattr(policy, name, value)
    for name in ("trainer_overrides", "gate_overrides"):
        if name in changes:
            setattr(policy, name, overrides_checked(name, changes[name]))
    for name, (low, high) in POLICY_RANGES.items():
        value = getattr(policy, name)
        if not low <= value <= high:
            raise ValidationFailed(f"{name}: must be from {low} to {high}, not {value}")
    if not 0.0 <= policy.heldout_fraction < 0.9:
        raise ValidationFailed("heldout_fraction: must be in [0, 0.9)")
    with transaction.atomic():
        policy.save()
        audit_record(
            tenant,
            actor=actor,
            action="training_policy.update",
            target_type="adapter",
            target_id=adapter.name,
            data={k: v for k, v in changes.items()},
        )
    return policy


MAX_EVAL_CASES = 500
_EVAL_FIELDS = ("prefix", "suffix", "middle")


def eval_set_upload(tenant: Tenant, *, adapter: Adapter, cases: Any, actor: str) -> EvalSet:
    """Replace the adapter's FIM eval set; every case names its fields' problems."""
    if not isinstance(cases, list) or not cases:
        raise ValidationFailed("cases: send a non-empty list of {prefix, suffix, middle}")
    if len(cases) > MAX_EVAL_CASES:
        raise ValidationFailed(f"cases: at most {MAX_EVAL_CASES} cases, got {len(cases)}")
    for index, case in enumerate(cases):
        if not isinstance(case, dict) or set(case) != set(_EVAL_FIELDS):
            raise ValidationFailed(f"cases[{index}]: must hold exactly prefix, suffix and middle")
        for name in _EVAL_FIELDS:
            if not isinstance(case[name], str) or "\x00" in case[name]:
                raise ValidationFailed(f"cases[{index}].{name}: must be a string without NUL characters")
    with transaction.atomic():
        eval_set, _ = EvalSet.objects.update_or_create(adapter=adapter, defaults={"tenant": tenant, "cases": cases})
        audit_record(
            tenant,
            actor=actor,
            action="eval_set.upload",
            target_type="adapter",
            target_id=adapter.name,
            data={"cases": len(cases)},
        )
    return eval_set


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


def _dispatch_next(tenant_id: int) -> TrainingRun | None:
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


def _lock_tenant(tenant_id: int) -> Tenant:
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
        new = training_events_new(adapter, parent=parent)
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
            tenant = _lock_tenant(adapter.tenant_id)
            active = TrainingRun.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES).count()
            if active >= tenant.max_concurrent_training_runs:
                return None
            run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, parent_version=parent, trigger=trigger)
            _dispatch_next(tenant.pk)
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


def training_run_claim(run_id: int, *, attempt: int) -> TrainingRun | None:
    """The worker takes a queued run (None: someone else has it, or it was requeued since)."""
    now = timezone.now()
    with transaction.atomic():
        run = TrainingRun.objects.filter(pk=run_id).only("tenant_id").first()
        if run is None:
            return None
        _lock_tenant(run.tenant_id)
        claimed = TrainingRun.objects.filter(pk=run_id, attempt=attempt, status=TrainingRun.Status.QUEUED).update(
            status=TrainingRun.Status.EXPORTING, started_at=now, heartbeat_at=now, dispatched_at=None
        )
        if not claimed:
            return None
        _dispatch_next(run.tenant_id)  # this tenant's next run takes its place in the queue
    return TrainingRun.objects.select_related("adapter__base_model", "parent_version", "tenant").get(pk=run_id)


def training_run_advance(run: TrainingRun, *, status: str, **fields: Any) -> bool:
    """Move an active run on, if it is still this attempt's; False means the reaper took it back."""
    fields = {**fields, "status": status, "heartbeat_at": timezone.now()}
    if status not in ACTIVE_STATUSES:
        fields["finished_at"] = timezone.now()
    moved = TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, status=run.status).update(**fields)
    if moved:
        for name, value in fields.items():
            setattr(run, name, value)
        if status in (TrainingRun.Status.FAILED, TrainingRun.Status.REJECTED):
            _run_ended_notify(run)
    return bool(moved)


def _run_ended_notify(run: TrainingRun) -> None:
    """Tell the tenant's webhooks that a run failed or its candidate was rejected by the gate."""
    event = "run.failed" if run.status == TrainingRun.Status.FAILED else "run.rejected"
    data: dict[str, Any] = {"run": run.pk, "adapter": run.adapter.name, "status": run.status, "error": run.error}
    if run.status == TrainingRun.Status.REJECTED:
        data["gate_reasons"] = (run.gate or {}).get("reasons", [])
    notification_send(run.tenant_id, event=event, data=data)


def training_run_advance_log(run: TrainingRun, line: str) -> None:
    """Append a line to a run's log (a finished run included)."""
    TrainingRun.objects.filter(pk=run.pk).update(log=Concat(F("log"), Value(line + "\n")))


def training_run_heartbeat(run_id: int, *, attempt: int) -> bool:
    return bool(
        TrainingRun.objects.filter(pk=run_id, attempt=attempt, status__in=ACTIVE_STATUSES).update(
            heartbeat_at=timezone.now()
        )
    )


def training_reap_stale(*, stale_after_s: int | None = None) -> list[int]:
    """Requeue runs whose worker stopped beating (killed, OOM, machine lost); fail them after
    ``TRAINING_MAX_ATTEMPTS``. Their half-made output is never registered: a version is only
    registered from a verified, renamed directory at the end of a run."""
    stale_after_s = settings.TRAINING_STALE_AFTER_S if stale_after_s is None else stale_after_s
    now = timezone.now()
    cutoff = now - timedelta(seconds=stale_after_s)
    working = [s for s in ACTIVE_STATUSES if s != TrainingRun.Status.QUEUED]
    # A run past its wall-time limit (and the worker's own grace to stop it) ends failed whether or not
    # its worker still beats: never requeued, so no tenant's settings can hold the gpu queue.
    overdue = now - timedelta(seconds=settings.TRAINING_MAX_RUN_S + stale_after_s)
    for run in TrainingRun.objects.filter(status__in=working, started_at__lt=overdue).select_related("output_version"):
        reason = wall_time_reason(run.output_version)
        if TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, status=run.status).update(
            status=TrainingRun.Status.FAILED, finished_at=now, error=reason
        ):
            run.status, run.error = TrainingRun.Status.FAILED, reason
            _run_ended_notify(run)
    requeued: list[int] = []
    stale = TrainingRun.objects.filter(status__in=working, heartbeat_at__lt=cutoff)
    for run in stale:
        if run.output_version_id is not None:
            # It registered its version, then its worker stopped (before loading it): the version stands,
            # and requeuing would drop the record of its window. vLLM loads it on first use.
            TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, status=run.status).update(
                status=TrainingRun.Status.CANDIDATE,
                finished_at=now,
                log=f"{run.log}the worker stopped after registering the version; it stands\n",
            )
            continue
        with transaction.atomic():
            if run.attempt >= settings.TRAINING_MAX_ATTEMPTS:
                reason = f"the worker stopped answering {run.attempt} times; giving up"
                if TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, status=run.status).update(
                    status=TrainingRun.Status.FAILED, finished_at=timezone.now(), error=reason
                ):
                    run.status, run.error = TrainingRun.Status.FAILED, reason
                    _run_ended_notify(run)
                continue
            _lock_tenant(run.tenant_id)
            # Still silent now: a run that was registering held its row and beat again once it could.
            moved = TrainingRun.objects.filter(
                pk=run.pk, attempt=run.attempt, status=run.status, heartbeat_at__lt=cutoff, output_version=None
            ).update(
                status=TrainingRun.Status.QUEUED,
                attempt=run.attempt + 1,
                heartbeat_at=None,
                dispatched_at=None,
                log=f"{run.log}requeued: no heartbeat since {run.heartbeat_at:%H:%M:%S} in {run.status}\n",
            )
            if moved:
                run.attempt += 1
                run.events.all().delete()  # the window is taken again when the run restarts
                _dispatch_next(run.tenant_id)
                requeued.append(run.pk)
    return requeued


def wall_time_reason(kept: AdapterVersion | None = None) -> str:
    """Why a run past its wall-time limit ended; ``kept``: the version it had registered before."""
    limit = settings.TRAINING_MAX_RUN_S
    outcome = f"version {kept.number} it had registered stands" if kept else "nothing was registered"
    return f"stopped: the run went past its wall-time limit of {limit} s (TRAINING_MAX_RUN_S); {outcome}"


def training_run_discard(run: TrainingRun, *, reason: str) -> TrainingRun | None:
    """End a run whose window held an end user erased meanwhile, and start its rerun without them.

    One transaction under the tenant's lock: the slot the run frees is the rerun's, no other
    adapter's. None (and the reason says so) where the rerun cannot start now."""
    with transaction.atomic():
        _lock_tenant(run.tenant_id)
        if not training_run_advance(run, status=TrainingRun.Status.FAILED, error=reason):
            return None
        rerun = training_schedule(run.adapter, force=True, parent=run.parent_version, trigger=RERUN_TRIGGER)
        if rerun is None:
            training_run_advance_log(run, "no rerun could start (the tenant is at its cap): start one by hand")
        return rerun


RERUN_TRIGGER = "rerun without an erased user"


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
    waiting = queued.filter(created_at__lt=cutoff).values_list("tenant_id", flat=True).distinct()
    for tenant_id in set(waiting) - {run.tenant_id for run in runs}:
        with transaction.atomic():
            _lock_tenant(tenant_id)
            sent = _dispatch_next(tenant_id)
        if sent is not None:
            runs.append(sent)
    return [run.pk for run in runs]
