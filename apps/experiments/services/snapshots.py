"""Statistics of running experiments: a snapshot of each arm's numbers and the decision they
support, and the automatic action a tenant chose for that decision."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.adapters.models import AdapterVersion
from apps.common.exceptions import Conflict, ValidationFailed
from apps.experiments.arm_data import experiment_arm_data
from apps.experiments.models import Experiment, ExperimentSnapshot
from apps.experiments.services.lifecycle import (
    _decided_notify,
    _end,
    _snapshot_summary,
    experiment_promote,
    experiment_rollback,
)
from apps.experiments.services.lineage import lineage_checks_all
from apps.experiments.stats import BLOCKED_SRM, INCONCLUSIVE, PROMOTE, ROLLBACK, ExperimentConfig, analyze
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record

logger = logging.getLogger(__name__)


def experiment_snapshot_take(experiment_id: int) -> ExperimentSnapshot | None:
    """Compute and store the statistics of a running experiment, then act on the decision where
    the tenant chose automatic actions; an experiment past its maximum duration ends inconclusive."""
    experiment = (
        Experiment.objects.select_related("tenant", "adapter", "candidate_version", "control_version")
        .filter(pk=experiment_id)
        .first()
    )
    if experiment is None or experiment.status != Experiment.Status.RUNNING:
        return None
    started = time.perf_counter()
    control, candidate = experiment_arm_data(experiment)
    config = ExperimentConfig.from_dict(experiment.config)
    elapsed = timezone.now() - (experiment.started_at or timezone.now())
    analysis = analyze(control, candidate, config=config, elapsed=elapsed)
    result = analysis.as_dict()
    snapshot = ExperimentSnapshot.objects.create(
        experiment=experiment,
        computed_at=timezone.now(),
        users=control.users + candidate.users,
        action=result["decision"]["action"],
        analysis=result,
        seconds=time.perf_counter() - started,
    )
    _act_on(experiment, result["decision"])
    return snapshot


def experiment_snapshot_now(tenant: Tenant, *, experiment: Experiment) -> Experiment:
    """The statistics of a running experiment, computed now because a person asked."""
    if experiment.status != Experiment.Status.RUNNING:
        raise ValidationFailed(f"experiment {experiment.pk} is {experiment.status}; snapshots are of running ones")
    experiment_snapshot_take(experiment.pk)
    experiment.refresh_from_db()
    return experiment


def _act_on(experiment: Experiment, decision: dict[str, Any]) -> None:
    action, reason = decision["action"], decision["reason"]
    tenant = experiment.tenant
    try:
        if action == PROMOTE and experiment.auto_promote:
            experiment_promote(tenant, experiment=experiment, actor="system:auto-promote", reason=reason)
        elif action == ROLLBACK and experiment.auto_rollback:
            experiment_rollback(tenant, experiment=experiment, actor="system:auto-rollback", reason=reason)
        elif action == INCONCLUSIVE:
            with transaction.atomic():
                if _end(
                    experiment,
                    status=Experiment.Status.DECIDED,
                    decision=INCONCLUSIVE,
                    reason=reason,
                    actor="system",
                    candidate_status=AdapterVersion.Status.CANDIDATE,
                ):
                    _decided_notify(experiment, decision=INCONCLUSIVE, reason=reason, actor="system")
                    audit_record(
                        tenant,
                        actor="system",
                        action="experiment.inconclusive",
                        target_type="experiment",
                        target_id=str(experiment.pk),
                        data={"reason": reason, "stats": _snapshot_summary(experiment)},
                    )
        elif action == BLOCKED_SRM:
            logger.warning("experiment %s: sample ratio mismatch blocks every decision: %s", experiment.pk, reason)
    except Conflict as exc:  # another action ended it first
        logger.info("experiment %s: automatic %s skipped: %s", experiment.pk, action, exc.message)


def experiment_snapshot_all() -> list[int]:
    """Beat, every minute: a snapshot of every running experiment; then every adapter's holdout
    and post-promotion alarms (``lineage``)."""
    taken = []
    for experiment_id in Experiment.objects.filter(status=Experiment.Status.RUNNING).values_list("pk", flat=True):
        try:
            if experiment_snapshot_take(experiment_id) is not None:
                taken.append(experiment_id)
        except Exception:  # one experiment's failure must not stop the others' snapshots
            logger.exception("snapshot of experiment %s failed", experiment_id)
    lineage_checks_all()
    return taken
