"""The life of an experiment and the actions a person takes on its result: create, start, stop,
promote, roll back; and the start a training policy asks for when a candidate registers.

Every action is a service that writes its audit row (who, when, before, after, and the latest
statistics) in the same transaction as the change. Promotion moves the production pointer with
``adapter_version_promote``; a rollback ends an experiment without moving it.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.adapters.loading import adapter_version_load_everywhere, serve_probe_verify
from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.services import adapter_version_promote
from apps.common.exceptions import Conflict, ValidationFailed
from apps.experiments.models import ARMS, Experiment
from apps.experiments.selectors import experiment_latest_snapshot, experiment_running_for
from apps.experiments.stats import PROMOTE, ROLLBACK, ExperimentConfig
from apps.notifications.services import notification_send
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record

logger = logging.getLogger(__name__)

STARTABLE_CANDIDATE_STATUSES = (AdapterVersion.Status.CANDIDATE,)


def _snapshot_summary(experiment: Experiment) -> dict[str, Any] | None:
    """What an audit row keeps of the statistics: the decision and the primary metric's numbers."""
    snapshot = experiment_latest_snapshot(experiment)
    if snapshot is None:
        return None
    analysis = snapshot.analysis
    primary = next((m for m in analysis.get("metrics", []) if m.get("role") == "primary"), None)
    return {
        "snapshot_id": snapshot.pk,
        "computed_at": snapshot.computed_at.isoformat(),
        "decision": analysis.get("decision"),
        "users": {arm: analysis.get("arms", {}).get(arm, {}).get("users") for arm in ARMS},
        "primary": primary,
        "srm": analysis.get("srm"),
    }


def _decided_notify(experiment: Experiment, *, decision: str, reason: str, actor: str) -> None:
    """Tell the tenant's webhooks how an experiment ended (in the transaction that ended it)."""
    notification_send(
        experiment.tenant_id,
        event="experiment.decided",
        data={
            "experiment": experiment.pk,
            "adapter": experiment.adapter.name,
            "decision": decision,
            "reason": reason,
            "candidate": experiment.candidate_version.number,
            "control": experiment.control_version.number if experiment.control_version else None,
            "actor": actor,
        },
    )


def experiment_create(
    tenant: Tenant,
    *,
    adapter: Adapter,
    candidate_version: AdapterVersion,
    actor: str,
    candidate_weight: float = 0.5,
    config: dict[str, Any] | None = None,
    to_start: bool = False,
) -> Experiment:
    """A draft experiment of ``candidate_version`` against the adapter's production version.

    ``to_start``: the caller starts it next, so while another experiment runs on the adapter it is
    refused here, before a draft is made (and audited) and the candidate loaded for a start that
    would fail. A draft alone may be made meanwhile: it starts from its page once the adapter is free."""
    if to_start:
        _refuse_while_running(adapter)
    if candidate_version.adapter_id != adapter.pk:
        raise ValidationFailed("candidate_version: belongs to another adapter")
    if candidate_version.status not in STARTABLE_CANDIDATE_STATUSES:
        raise Conflict(
            f"candidate_version: version {candidate_version.number} is {candidate_version.status}; only a gated "
            "candidate can be tested",
            code="not_a_candidate",
        )
    if not 0.0 < candidate_weight < 1.0:
        raise ValidationFailed("candidate_weight: must be between 0 and 1 (exclusive)")
    stats = ExperimentConfig.from_dict({**(config or {}), "weights": [1 - candidate_weight, candidate_weight]})
    with transaction.atomic():
        experiment = Experiment.objects.create(
            tenant=tenant,
            adapter=adapter,
            candidate_version=candidate_version,
            candidate_weight=candidate_weight,
            config=stats.to_dict(),
            auto_promote=tenant.experiment_auto_promote,
            auto_rollback=tenant.experiment_auto_rollback,
            created_by=actor,
        )
        audit_record(
            tenant,
            actor=actor,
            action="experiment.create",
            target_type="experiment",
            target_id=str(experiment.pk),
            data={"adapter": adapter.name, "candidate": candidate_version.vllm_name, "weight": candidate_weight},
        )
    return experiment


def _refuse_while_running(adapter: Adapter) -> None:
    """One experiment runs per adapter (a database constraint a start meets at commit): asked first,
    so that nothing is made or loaded for a start that cannot happen."""
    running = experiment_running_for(adapter)
    if running is not None:
        raise Conflict(
            f"experiment {running.pk} is already running on {adapter.name}; stop it first",
            code="experiment_running",
        )


def experiment_start(tenant: Tenant, *, experiment: Experiment, actor: str) -> Experiment:
    """Load the candidate on every replica, check vLLM serves exactly its weights, then start.

    Control is production at this moment. The salt is drawn here and never changes."""
    if experiment.status != Experiment.Status.DRAFT:
        raise Conflict(f"experiment {experiment.pk} is {experiment.status}; only a draft can start", code="not_draft")
    _refuse_while_running(experiment.adapter)
    candidate = experiment.candidate_version
    adapter_version_load_everywhere(candidate)
    checks = serve_probe_verify(candidate)
    try:
        with transaction.atomic():
            adapter = Adapter.objects.select_for_update(no_key=True).get(pk=experiment.adapter_id)
            # A draft outlives its candidate's fate: another experiment of the same version may have
            # promoted or retired it since this one was made. Read under the adapter's lock, as every
            # promotion takes it.
            status = AdapterVersion.objects.values_list("status", flat=True).get(pk=candidate.pk)
            if status not in STARTABLE_CANDIDATE_STATUSES or adapter.production_version_id == candidate.pk:
                raise Conflict(
                    f"version {candidate.number} is {status} now; only a gated candidate can be tested (this draft "
                    "was made before it changed: make a new experiment of a candidate)",
                    code="not_a_candidate",
                )
            moved = Experiment.objects.filter(pk=experiment.pk, status=Experiment.Status.DRAFT).update(
                status=Experiment.Status.RUNNING,
                control_version=adapter.production_version,
                salt=secrets.token_hex(8),
                started_at=timezone.now(),
            )
            if not moved:
                raise Conflict(f"experiment {experiment.pk} was started or ended meanwhile", code="not_draft")
            AdapterVersion.objects.filter(pk=candidate.pk).update(status=AdapterVersion.Status.IN_EXPERIMENT)
            experiment.refresh_from_db()
            audit_record(
                tenant,
                actor=actor,
                action="experiment.start",
                target_type="experiment",
                target_id=str(experiment.pk),
                data={
                    "control": experiment.control_version.vllm_name if experiment.control_version else None,
                    "candidate": candidate.vllm_name,
                    "probe": [{"replica": c.replica, "max_abs_diff": c.max_abs_diff} for c in checks],
                },
            )
    except IntegrityError:
        raise Conflict(
            f"adapter {experiment.adapter.name} already has a running experiment; stop it first",
            code="experiment_running",
        ) from None
    return experiment


def _end(experiment: Experiment, *, status: str, decision: str, reason: str, actor: str, candidate_status: str) -> bool:
    """Move a running experiment to its end state (guarded: only one action ends it). The adapter's
    row is locked first, as every promotion, rollback and start locks it before the experiment or
    its versions: one order of locks, so a hand rollback and the snapshot's auto-promote never deadlock."""
    Adapter.objects.select_for_update(no_key=True).filter(pk=experiment.adapter_id).first()
    moved = Experiment.objects.filter(pk=experiment.pk, status=Experiment.Status.RUNNING).update(
        status=status, decision=decision, decision_reason=reason, ended_at=timezone.now(), ended_by=actor
    )
    if moved:
        AdapterVersion.objects.filter(
            pk=experiment.candidate_version_id, status=AdapterVersion.Status.IN_EXPERIMENT
        ).update(status=candidate_status)
        experiment.refresh_from_db()
    return bool(moved)


def _end_running(experiment: Experiment, **end: Any) -> None:
    """``_end`` for an action a person asked for: one that lost the race to another is a 409."""
    if not _end(experiment, **end):
        raise Conflict(f"experiment {experiment.pk} ended meanwhile", code="not_running")


def _require_running(experiment: Experiment) -> None:
    if experiment.status != Experiment.Status.RUNNING:
        raise Conflict(f"experiment {experiment.pk} is {experiment.status}, not running", code="not_running")


def experiment_stop(tenant: Tenant, *, experiment: Experiment, actor: str, reason: str = "") -> Experiment:
    """End the experiment without a verdict: everyone gets production again; the candidate stays a candidate."""
    _require_running(experiment)
    with transaction.atomic():
        summary = _snapshot_summary(experiment)
        _end_running(
            experiment,
            status=Experiment.Status.STOPPED,
            decision="",
            reason=reason or "stopped",
            actor=actor,
            candidate_status=AdapterVersion.Status.CANDIDATE,
        )
        audit_record(
            tenant,
            actor=actor,
            action="experiment.stop",
            target_type="experiment",
            target_id=str(experiment.pk),
            data={"reason": reason, "stats": summary},
        )
    return experiment


def experiment_promote(tenant: Tenant, *, experiment: Experiment, actor: str, reason: str = "") -> Experiment:
    """Make the candidate production: every replica serves it first, then the pointer moves."""
    _require_running(experiment)
    candidate = experiment.candidate_version
    adapter_version_load_everywhere(candidate)
    candidate.refresh_from_db()
    with transaction.atomic():
        summary = _snapshot_summary(experiment)
        _end_running(
            experiment,
            status=Experiment.Status.DECIDED,
            decision=PROMOTE,
            reason=reason or "promoted",
            actor=actor,
            candidate_status=AdapterVersion.Status.IN_EXPERIMENT,
        )
        adapter_version_promote(tenant, version=candidate, actor=actor)
        _decided_notify(experiment, decision=PROMOTE, reason=reason or "promoted", actor=actor)
        audit_record(
            tenant,
            actor=actor,
            action="experiment.promote",
            target_type="experiment",
            target_id=str(experiment.pk),
            data={
                "before": experiment.control_version.vllm_name if experiment.control_version else None,
                "after": candidate.vllm_name,
                "reason": reason,
                "stats": summary,
            },
        )
    return experiment


def experiment_rollback(tenant: Tenant, *, experiment: Experiment, actor: str, reason: str = "") -> Experiment:
    """Reject the candidate: production stays as it was, the candidate is retired."""
    _require_running(experiment)
    with transaction.atomic():
        summary = _snapshot_summary(experiment)
        _end_running(
            experiment,
            status=Experiment.Status.DECIDED,
            decision=ROLLBACK,
            reason=reason or "rolled back",
            actor=actor,
            candidate_status=AdapterVersion.Status.RETIRED,
        )
        _decided_notify(experiment, decision=ROLLBACK, reason=reason or "rolled back", actor=actor)
        audit_record(
            tenant,
            actor=actor,
            action="experiment.rollback",
            target_type="experiment",
            target_id=str(experiment.pk),
            data={
                "production": experiment.control_version.vllm_name if experiment.control_version else None,
                "retired": experiment.candidate_version.vllm_name,
                "reason": reason,
                "stats": summary,
            },
        )
    return experiment
