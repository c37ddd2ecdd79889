"""The life of a training run. Every transition is a guarded UPDATE, so a task delivered twice, a
reaper and a worker coming back from the dead cannot both move one run."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Concat
from django.utils import timezone

from apps.adapters.models import AdapterVersion
from apps.common.exceptions import Conflict
from apps.notifications.services import notification_send
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record
from apps.training.models import ACTIVE_STATUSES, TrainingRun
from apps.training.services.scheduling import tenant_dispatch_next, tenant_lock, training_schedule

logger = logging.getLogger(__name__)


def training_run_claim(run_id: int, *, attempt: int) -> TrainingRun | None:
    """The worker takes a queued run (None: someone else has it, or it was requeued since)."""
    now = timezone.now()
    with transaction.atomic():
        run = TrainingRun.objects.filter(pk=run_id).only("tenant_id").first()
        if run is None:
            return None
        tenant_lock(run.tenant_id)
        claimed = TrainingRun.objects.filter(pk=run_id, attempt=attempt, status=TrainingRun.Status.QUEUED).update(
            status=TrainingRun.Status.EXPORTING, started_at=now, heartbeat_at=now, dispatched_at=None
        )
        if not claimed:
            return None
        tenant_dispatch_next(run.tenant_id)  # this tenant's next run takes its place in the queue
    return TrainingRun.objects.select_related("adapter__base_model", "parent_version", "tenant").get(pk=run_id)


def training_run_advance(run: TrainingRun, *, status: str, **fields: Any) -> bool:
    """Move an active run on, if it is still this attempt's; False means the reaper took it back.
    A run that ends failed or rejected commits with its webhook deliveries, never one without the other."""
    fields = {**fields, "status": status, "heartbeat_at": timezone.now()}
    if status not in ACTIVE_STATUSES:
        fields["finished_at"] = timezone.now()
    with transaction.atomic():
        moved = TrainingRun.objects.filter(pk=run.pk, attempt=run.attempt, status=run.status).update(**fields)
        if moved and status in (TrainingRun.Status.FAILED, TrainingRun.Status.REJECTED):
            _run_ended_notify(
                run, status=status, error=fields.get("error", run.error), gate=fields.get("gate", run.gate)
            )
    # The instance follows only a committed change: a caller that handles an error here still reads the
    # run as the database holds it.
    if moved:
        for name, value in fields.items():
            setattr(run, name, value)
    return bool(moved)


def _run_ended_notify(run: TrainingRun, *, status: str, error: str, gate: dict[str, Any] | None = None) -> None:
    """Tell the tenant's webhooks that ``run`` ended ``status``: failed, or its candidate rejected by the
    gate. Called in the transaction that ends it, so its deliveries commit with the change they report
    (docs/dashboard.md, webhooks), or not at all."""
    event = "run.failed" if status == TrainingRun.Status.FAILED else "run.rejected"
    data: dict[str, Any] = {"run": run.pk, "adapter": run.adapter.name, "status": status, "error": error}
    if status == TrainingRun.Status.REJECTED:
        data["gate_reasons"] = (gate or {}).get("reasons", [])
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
        with transaction.atomic():
            # Only as read: a version registered since (its status unchanged) is left to the next pass,
            # which reads it, rather than the run ending with "nothing was registered" beside it.
            if TrainingRun.objects.filter(
                pk=run.pk, attempt=run.attempt, status=run.status, output_version=run.output_version_id
            ).update(status=TrainingRun.Status.FAILED, finished_at=now, error=reason):
                _run_ended_notify(run, status=TrainingRun.Status.FAILED, error=reason)
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
                # Still silent and still without a version, as the requeue below.
                if TrainingRun.objects.filter(
                    pk=run.pk, attempt=run.attempt, status=run.status, heartbeat_at__lt=cutoff, output_version=None
                ).update(status=TrainingRun.Status.FAILED, finished_at=timezone.now(), error=reason):
                    _run_ended_notify(run, status=TrainingRun.Status.FAILED, error=reason)
                continue
            tenant_lock(run.tenant_id)
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
                tenant_dispatch_next(run.tenant_id)
                requeued.append(run.pk)
    return requeued


def wall_time_reason(kept: AdapterVersion | None = None) -> str:
    """Why a run past its wall-time limit ended; ``kept``: the version it had registered before."""
    limit = settings.TRAINING_MAX_RUN_S
    outcome = f"version {kept.number} it had registered stands" if kept else "nothing was registered"
    return f"stopped: the run went past its wall-time limit of {limit} s (TRAINING_MAX_RUN_S); {outcome}"


def training_run_discard(run: TrainingRun, *, reason: str, from_head: bool = False) -> TrainingRun | None:
    """End a run whose window held an end user erased meanwhile, and start its rerun without them
    (``from_head``: one whose parent left the lineage meanwhile, rerun from the current head).

    One transaction under the tenant's lock: the slot the run frees is the rerun's, no other
    adapter's. None (and the reason says so) where the rerun cannot start now."""
    with transaction.atomic():
        tenant_lock(run.tenant_id)
        if not training_run_advance(run, status=TrainingRun.Status.FAILED, error=reason):
            return None
        if from_head:
            rerun = training_schedule(run.adapter, force=True, trigger=RERUN_FROM_HEAD_TRIGGER)
        else:
            rerun = training_schedule(run.adapter, force=True, parent=run.parent_version, trigger=RERUN_TRIGGER)
        if rerun is None:
            training_run_advance_log(run, "no rerun could start (the tenant is at its cap): start one by hand")
        return rerun


RERUN_TRIGGER = "rerun without an erased user"
RERUN_FROM_HEAD_TRIGGER = "rerun from the current head (the parent left the lineage)"


def training_window_exclude(tenant: Tenant, *, run: TrainingRun, actor: str) -> TrainingRun:
    """Leave a rejected run's events (its window and what it held out) out of training for good.

    A rejected run does not use up its events, so the next run takes the same oldest ones: a window
    whose outcomes the client reported the wrong way round, and cannot send again, would be rejected
    run after run. Left out, the next run takes the events after them. Only a rejected run's (a run
    that registered a version learned its events; an active one has not decided); doing it twice
    changes nothing. Audited (``training_run.exclude_window``). The events stay where they are for
    the dashboard, experiments and erase; a later outcome sent for one of them does not bring it back."""
    if run.tenant_id != tenant.pk:
        raise ValueError("run belongs to another tenant")
    if run.status != TrainingRun.Status.REJECTED:
        raise Conflict(
            f"only a rejected run's events can be left out of training: run {run.pk} is {run.status}",
            code="run_not_rejected",
        )
    with transaction.atomic():
        marked = TrainingRun.objects.filter(pk=run.pk, window_excluded_at__isnull=True).update(
            window_excluded_at=timezone.now(), window_excluded_by=actor[:200]
        )
        if marked:
            audit_record(
                tenant,
                actor=actor,
                action="training_run.exclude_window",
                target_type="training_run",
                target_id=str(run.pk),
                data={"adapter": run.adapter.name, "events": run.events.count()},
            )
    run.refresh_from_db(fields=["window_excluded_at", "window_excluded_by"])
    return run
