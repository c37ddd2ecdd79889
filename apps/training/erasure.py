"""What training keeps of an erased end user, and retraining a lineage without them.

An erase deletes the user's events, and with them the rows that said which runs' windows held
them. Before they go, every such run (an active one included) gets a TrainingRunErasure: a keyed
one-way hash of the user, so the versions those runs produced stay marked. An active run sees
its mark at its next step and is discarded, and a new run without the user takes its place; a
finished version stays until a tenant admin retrains its lineage from the last version that never
learned from an erased user (``training_lineage_retrain``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.models import Count, QuerySet

from apps.adapters.models import Adapter, AdapterVersion
from apps.cohorts.erased import erasure_hmac
from apps.common.exceptions import Conflict
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record
from apps.training.models import ACTIVE_STATUSES, TrainingRun, TrainingRunErasure, TrainingRunEvent
from apps.training.selectors import adapter_lineage_head
from apps.training.services import training_schedule
from apps.training.services.scheduling import tenant_lock

RETRAIN_TRIGGER = "retrain without erased users"
LOCK_NOT_AVAILABLE = "55P03"  # Postgres: lock_timeout ran out


def erased_user_hash(tenant: Tenant, external_id: str) -> str:
    """Keyed, so a list of likely ids (emails) cannot be hashed and matched against the records; with
    ``ERASURE_MARK_KEY``, a key of its own, so rotating ``SECRET_KEY`` leaves the marks valid."""
    return erasure_hmac(f"{tenant.pk}:{external_id}")


@dataclass
class ErasedRuns:
    """The runs whose windows held an erased user, as the erase report names them."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    retrain: list[dict[str, str]] = field(default_factory=list)


class RunsBusy(Exception):
    """A run held its row past ``training_windows_hold``'s ``wait_s``; the caller's transaction is
    spoilt and rolls back."""


def training_windows_hold(tenant_id: int, *, wait_s: float | None = None) -> None:
    """Until the caller's transaction ends, no run of the tenant fixes its window, registers a
    version, is requeued or scheduled: the tenant's lock, then its active runs' rows, in the order
    scheduling, claiming and requeuing take them (no deadlock with one). A run fixing its window
    holds its row until the window is committed (apps.training.dataset): this waits for it, at most
    ``wait_s`` on Postgres where given (then :class:`RunsBusy`)."""
    if wait_s is None or connection.vendor != "postgresql":
        _hold(tenant_id)
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        (before,) = cursor.fetchone()
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{int(wait_s * 1000)}ms"])
        try:
            _hold(tenant_id)
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise RunsBusy(f"a training run held its window or version past {wait_s:g} s") from exc
            raise
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [before])  # later statements wait as before


def _hold(tenant_id: int) -> None:
    tenant_lock(tenant_id)
    list(
        TrainingRun.objects.select_for_update()
        .filter(tenant_id=tenant_id, status__in=ACTIVE_STATUSES)
        .order_by("pk")
        .values_list("pk")
    )


def training_erasure_record(tenant: Tenant, *, interactions: QuerySet[Any], external_id: str) -> ErasedRuns:
    """Mark every run whose window holds these interactions' events; call before they are deleted,
    inside the erase's transaction."""
    # The tenant's active runs are locked first: one fixing its window holds its row until the window
    # is committed (apps.training.dataset), so its events are read below; one that starts fixing it
    # after waits for the erase, and its window finds the user's feedback gone. Under the tenant's
    # lock, as scheduling, claiming and requeuing take the tenant's and then runs' rows (a requeue
    # locks its run, then the queued run it sends next, which may have the lower id): taken in the
    # same order, an erase waits for them instead of deadlocking with one.
    training_windows_hold(tenant.pk)
    events = TrainingRunEvent.objects.filter(run__tenant=tenant, feedback__interaction__in=interactions)
    trained: dict[int, bool] = {}  # run id -> whether the user was in its trained part (else held out only)
    for run_id, held_out in events.values_list("run_id", "held_out").distinct():
        trained[run_id] = trained.get(run_id, False) or not held_out
    # The runs' rows are locked first (the marks' foreign keys are checked only at commit, so their
    # insert takes no lock): a run registering its version holds its row until it has, and is read
    # here as it ended; one that comes to register after finds the marks.
    list(TrainingRun.objects.select_for_update().filter(pk__in=trained).order_by("pk").values_list("pk"))
    # Read again once locked: a statement that waited for a lock sees the run's new row but not the
    # rows the other transaction added beside it (its version).
    runs = list(TrainingRun.objects.filter(pk__in=trained).select_related("adapter", "output_version").order_by("pk"))
    user_hash = erased_user_hash(tenant, external_id)
    marks = [TrainingRunErasure(tenant=tenant, run_id=pk, user_hash=user_hash, trained_on=on)
             for pk, on in trained.items()]
    TrainingRunErasure.objects.bulk_create(marks, ignore_conflicts=True)
    out = ErasedRuns()
    for run in runs:
        version = run.output_version
        if version is not None:
            action = f"version {version.number} learned from this user: retrain its lineage without them"
        elif run.status in ACTIVE_STATUSES:
            action = "discarded and rerun without this user"
        else:
            action = "none (it registered no version)"
        out.runs.append({
            "run": run.pk,
            "adapter": run.adapter.name,
            "status": run.status,
            "version": version.number if version else None,
            "trained_on": trained[run.pk],
            "action": action,
        })
    adapters = sorted({run.adapter.name for run in runs if trained[run.pk] and run.output_version_id})
    how = "POST /v1/adapters/{}/retrain, or Retrain without erased users on its Versions page"
    out.retrain = [{"adapter": name, "how": how.format(name)} for name in adapters]
    return out


def training_run_erased(run: TrainingRun) -> bool:
    """An end user in this run's window was erased (the run must not register what it learned)."""
    return TrainingRunErasure.objects.filter(run_id=run.pk).exists()


def erased_users_per_version(adapter: Adapter) -> dict[int, int]:
    """Version id -> how many erased end users its own run trained on (marked versions only; one query)."""
    rows = (
        TrainingRunErasure.objects.filter(run__adapter=adapter, run__output_version__isnull=False, trained_on=True)
        .values("run__output_version")
        .annotate(users=Count("user_hash", distinct=True))
    )
    return {row["run__output_version"]: row["users"] for row in rows}


def retrain_parent(adapter: Adapter) -> tuple[AdapterVersion | None, list[AdapterVersion]]:
    """(the newest version of the head's lineage that learned from no erased user, the marked ones).

    A version inherits what its parent learned, so the clean parent is the parent of the oldest
    marked version in the lineage (None: the base model). Two queries, however long the lineage."""
    marked = set(erased_users_per_version(adapter))
    head = adapter_lineage_head(adapter)
    versions = {v.pk: v for v in AdapterVersion.objects.filter(adapter=adapter)} if head is not None else {}
    lineage: list[AdapterVersion] = []
    version = versions.get(head.pk) if head is not None else None
    while version is not None:
        lineage.append(version)
        version = versions.get(version.parent_id) if version.parent_id is not None else None
    tainted = [v for v in lineage if v.pk in marked]
    if not tainted:
        return (lineage[0] if lineage else None), []
    oldest = tainted[-1]
    return (versions.get(oldest.parent_id) if oldest.parent_id is not None else None), tainted


@transaction.atomic
def training_lineage_retrain(tenant: Tenant, *, adapter: Adapter, actor: str) -> TrainingRun:
    """One action: a run from the last clean version, on every event the marked versions learned
    (the erased users' are gone) and all since. Its candidate then goes through the gate and an
    experiment like any other; the marked versions stay until it replaces them."""
    if adapter.tenant_id != tenant.pk:
        raise ValueError("adapter belongs to another tenant")
    parent, tainted = retrain_parent(adapter)
    if not tainted:
        raise Conflict(
            f"no version in the lineage of {adapter.name!r} learned from an erased end user; nothing to retrain",
            code="nothing_to_retrain",
        )
    run = training_schedule(adapter, force=True, parent=parent, trigger=RETRAIN_TRIGGER)
    if run is None:
        busy = "a training run is already going for this adapter or tenant; retrain after it"
        raise Conflict(busy, code="run_active")
    audit_record(
        tenant,
        actor=actor,
        action="training_run.retrain",
        target_type="training_run",
        target_id=str(run.pk),
        data={
            "adapter": adapter.name,
            "from": parent.vllm_name if parent else "base",
            "replaces": [v.vllm_name for v in tainted],
        },
    )
    return run
