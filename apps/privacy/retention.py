"""Retention: interactions and their feedback older than the tenant's retention are deleted.

The tenant sets ``retention_days`` (dashboard settings, ``PATCH /v1/tenant``), bounded by the
operator's ``STROP_RETENTION_MAX_DAYS``, which also applies to a tenant that set nothing. Beat runs
:func:`retention_prune_all` hourly. It lives here, above training and experiments, because what it
must never delete is theirs:

* interactions a **running experiment** served (its statistics read them, control arm included);
* what a **training window** needs: the events of an active run (queued runs have not fixed their
  window yet, so an adapter with one keeps its old events this pass), and the events of runs whose
  version is still live (candidate, in experiment, production) or retired (it can be promoted
  back), and of every ancestor of such a version (it carries what they learned): an **erase**
  reads them to say which versions learned from the user. The windows of purged or failed
  versions, and of runs that registered none, go.

Each pass deletes in batches (short transactions: ingest goes on beside it), reading what it must
keep anew for each batch while the tenant's runs are held (``training_windows_hold``), and records
what it removed in the audit log (``retention.prune``) and in ``strop_retention_deleted_total`` on
``/metrics``, what its batches committed before a failure included.
Rollups are never deleted: each batch adds what its interactions counted to their hours' ledger as
it deletes them (``rollups_pruned_keep``), and an hour is recomputed as its raw rows plus its ledger
(``apps.interactions.rollups``), so the charts keep their history and stay exact for the old rows
that stay.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.cohorts.erased import erased_ids_expire
from apps.common.lookups import in_values
from apps.common.observability.metrics import retention_counted
from apps.experiments.models import Experiment
from apps.interactions.models import ConversationOutcome, Feedback, Interaction, PersistenceReport, ServingFailure
from apps.interactions.rollups import retention_cutoff, rollups_pruned_keep
from apps.privacy.deletion import keys_delete
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record
from apps.training.erasure import RunsBusy, training_windows_hold
from apps.training.models import ACTIVE_STATUSES, TrainingRun, TrainingRunEvent
from apps.training.selectors import GOOD_VERSION_STATUSES, interaction_belongs_to_adapter

BATCH = 5000
# How long a batch waits for the tenant's runs (one fixing its window or registering its version
# holds its row): past it, the pass leaves the old interactions to the next one rather than hold the
# tenant's lock, which scheduling, claiming and the reaper wait for, while it waits.
RUNS_WAIT_S = 5.0

logger = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    cutoff: datetime | None
    deleted: dict[str, int] = field(default_factory=dict)
    deferred: str = ""  # why the old interactions were left to the next pass, if they were

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"cutoff": self.cutoff.isoformat() if self.cutoff else None, "deleted": self.deleted}
        if self.deferred:
            out["deferred"] = self.deferred
        return out


def _versions_an_erase_reads(tenant: Tenant) -> set[int]:
    """Live versions (and retired ones, which can be promoted back) with every ancestor: each
    carries what its ancestors learned, so their windows must stay for an erase to find it."""
    rows = list(AdapterVersion.objects.filter(tenant=tenant).values_list("pk", "parent_id", "status"))
    parents = {pk: parent for pk, parent, _status in rows}
    live = AdapterVersion.Status.RETIRED, *GOOD_VERSION_STATUSES
    keep: set[int] = set()
    for pk, _parent, status in rows:
        current = pk if status in live else None
        while current is not None and current not in keep:
            keep.add(current)
            current = parents.get(current)
    return keep


def _deletable(tenant: Tenant, cutoff: datetime) -> QuerySet[Interaction]:
    """The tenant's interactions served before ``cutoff`` that this pass may delete: not those it
    must keep (see the module's docstring). ``NOT EXISTS`` per row (an anti-join), not ``NOT IN``."""
    old = Interaction.objects.filter(tenant=tenant, served_at__lt=cutoff)
    running = list(
        Experiment.objects.filter(tenant=tenant, status=Experiment.Status.RUNNING).values_list("pk", flat=True)
    )
    if running:
        old = old.exclude(experiment_id__in=running)
    runs = TrainingRun.objects.filter(tenant=tenant).filter(
        Q(status__in=ACTIVE_STATUSES) | Q(output_version_id__in=_versions_an_erase_reads(tenant))
    )
    in_window = TrainingRunEvent.objects.filter(run__in=runs, feedback__interaction_id=OuterRef("pk"))
    old = old.filter(~Exists(in_window))
    unfixed = TrainingRun.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES, events__isnull=True)
    for adapter in Adapter.objects.filter(pk__in=unfixed.values("adapter_id")):
        old = old.exclude(interaction_belongs_to_adapter(adapter))
    return old


def retention_prune(tenant: Tenant, *, now: datetime | None = None, batch: int = BATCH) -> RetentionReport:
    """Delete the tenant's interactions (with their feedback and persistence reports) served before
    its retention cutoff, its pending feedback, pending persistence reports (they hold the user's
    code), serving failures and sessions' outcomes no kept turn carries, older than that; what must
    stay stays."""
    cutoff = retention_cutoff(tenant.pk, now=now)
    report = RetentionReport(cutoff=cutoff)
    if cutoff is None:
        return report
    kinds = (
        "interactions",
        "feedback",
        "persistence_reports",
        "training_window_events",  # of windows no version an erase reads needs (purged, failed, none)
        "pending_feedback",
        "pending_persistence_reports",
        "serving_failures",
        "session_outcomes",
    )
    report.deleted = dict.fromkeys(kinds, 0)
    try:
        _prune(tenant, cutoff, batch, report)
    except Exception as exc:  # what the batches before it deleted is gone: it is recorded all the same
        _recorded(tenant, report, error=f"{type(exc).__name__}: {exc}")
        raise
    _recorded(tenant, report)
    return report


def _recorded(tenant: Tenant, report: RetentionReport, *, error: str = "") -> None:
    """The audit entry and ``/metrics``' counts of what a pass deleted (nothing: no entry)."""
    if not any(report.deleted.values()):
        return
    data = report.as_dict()
    if error:
        data["error"] = error[:500]  # the pass stopped there; the next one goes on
    audit_record(
        tenant, actor="system", action="retention.prune", target_type="tenant", target_id=tenant.slug, data=data
    )
    retention_counted(tenant.slug, report.deleted)


def _prune(tenant: Tenant, cutoff: datetime, batch: int, report: RetentionReport) -> None:
    """The pass's deletes, batch by batch, counted into the report as each batch commits."""
    deleted = report.deleted
    # Walked by (served_at, id): each batch starts past the last one, so kept rows are read once.
    after: tuple[datetime, UUID] | None = None
    while True:
        try:
            with transaction.atomic():
                # No window is fixed, version registered or run requeued while a batch is chosen and
                # deleted, and what it must keep is read anew each batch: a pass of many batches sees
                # a run that ended meanwhile as it is now (its version, live, keeps its window).
                training_windows_hold(tenant.pk, wait_s=RUNS_WAIT_S)
                page = _deletable(tenant, cutoff).order_by("served_at", "id")
                if after is not None:
                    page = page.filter(Q(served_at__gt=after[0]) | Q(served_at=after[0], id__gt=after[1]))
                keys = list(page.values_list("served_at", "id")[:batch])
                if not keys:
                    break
                after = keys[-1]
                ids = [pk for _, pk in keys]
                batch_rows = Interaction.objects.filter(  # by the served-time index, the batch's keys among its rows
                    tenant=tenant, served_at__gte=keys[0][0], served_at__lte=after[0], **in_values("pk", ids)
                )
                rollups_pruned_keep(tenant.pk, batch_rows)  # their hours' charts keep them
                counts = keys_delete(Interaction, ids)  # the tenant's, as found above
        except RunsBusy as exc:
            report.deferred = f"{exc}; the next pass goes on"
            logger.warning("retention pass for tenant %s (%s): %s", tenant.pk, tenant.slug, report.deferred)
            break
        # Counted once the batch has committed.
        deleted["feedback"] += counts["interactions.Feedback"]
        deleted["interactions"] += counts["interactions.Interaction"]
        deleted["persistence_reports"] += counts["interactions.PersistenceReport"]
        deleted["training_window_events"] += counts["training.TrainingRunEvent"]
    # The rest by key in batches too: a tenant's first pass, or one after its retention was shortened,
    # may find hundreds of thousands of each. Pending labels by their last event: one sent again
    # since the cutoff is recent.
    pending = Feedback.objects.filter(tenant=tenant, interaction__isnull=True, updated_at__lt=cutoff)
    _kind_delete(pending, "pending_feedback", batch, deleted)
    reports = PersistenceReport.objects.filter(tenant=tenant, interaction__isnull=True, updated_at__lt=cutoff)
    _kind_delete(reports, "pending_persistence_reports", batch, deleted)
    running = Experiment.objects.filter(tenant=tenant, status=Experiment.Status.RUNNING).values("pk")
    failures = ServingFailure.objects.filter(tenant=tenant, occurred_at__lt=cutoff).exclude(experiment_id__in=running)
    _kind_delete(failures, "serving_failures", batch, deleted)
    # Sessions' outcomes last changed before the cutoff that no kept turn carries any more (one that
    # waited for turns that never came, or whose turns went above).
    carried = Feedback.objects.filter(session_outcome=OuterRef("pk"))
    outcomes = ConversationOutcome.objects.filter(tenant=tenant, updated_at__lt=cutoff).exclude(Exists(carried))
    _kind_delete(outcomes, "session_outcomes", batch, deleted)


def _kind_delete(rows: QuerySet[Any], kind: str, batch: int, deleted: dict[str, int]) -> None:
    """:func:`_batches_delete`, its rows counted as ``kind`` (what its batches committed, even if a
    later one fails), the training events that cascaded from them as such."""
    counts: Counter[str] = Counter()
    try:
        _batches_delete(rows, batch, counts)
    finally:
        deleted[kind] += counts[rows.model._meta.label]
        deleted["training_window_events"] += counts["training.TrainingRunEvent"]


def _batches_delete(rows: QuerySet[Any], batch: int, counts: Counter[str]) -> None:
    """Delete ``rows`` (with what cascades from them, :func:`keys_delete`) ``batch`` keys a short
    transaction, as ingest goes on beside it, adding each committed batch's rows by model label to
    ``counts``. Walked by key, each batch past the last: rows the filter keeps are read once.

    A batch's rows are locked, then read again by the whole filter: one changed meanwhile (a pending
    label attached to its interaction, a session's outcome sent again or spread to a new turn) no
    longer matches and stays; locked, none can change until the batch is deleted."""
    model = rows.model
    after = None
    while True:
        with transaction.atomic():
            page = rows.order_by("pk") if after is None else rows.filter(pk__gt=after).order_by("pk")
            keys = list(page.values_list("pk", flat=True)[:batch])
            if not keys:
                return
            after = keys[-1]
            locked = list(model.objects.select_for_update().filter(pk__in=keys).order_by("pk").values_list("pk"))
            still = list(rows.filter(pk__in=[pk for (pk,) in locked]).values_list("pk", flat=True))
            done = keys_delete(model, still)
        counts.update(done)


def retention_prune_all(*, now: datetime | None = None) -> dict[str, RetentionReport]:
    """Beat: every tenant with a retention (its own, or the operator's maximum). A tenant whose pass
    fails is logged (with its id) and left out of the answer; the others go on."""
    now = now or timezone.now()
    reports: dict[str, RetentionReport] = {}
    for tenant in Tenant.objects.order_by("pk"):
        try:
            reports[tenant.slug] = retention_prune(tenant, now=now)
        except Exception:  # one tenant's failure must not stop the pass for the others
            logger.exception(
                "retention pass failed for tenant %s (%s); the next pass retries it", tenant.pk, tenant.slug
            )
    erased_ids_expire(now=now)  # what erases removed, remembered a while (apps.cohorts.erased)
    return reports
