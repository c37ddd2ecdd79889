"""The life of an experiment and the actions on its result: start, stop, promote, roll back.

Every action is a service that writes its audit row (who, when, before, after, and the latest
statistics) in the same transaction as the change. Promotion moves the production pointer with
``adapter_version_promote``; a rollback moves it back, or ends an experiment without moving it.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.services import adapter_version_promote
from apps.cohorts.models import EndUser
from apps.common.exceptions import Conflict, ValidationFailed
from apps.experiments.models import ARMS, Experiment, ExperimentExposure, ExperimentSnapshot
from apps.experiments.selectors import experiment_latest_snapshot, experiment_running_for
from apps.experiments.stats import BLOCKED_SRM, INCONCLUSIVE, PROMOTE, ROLLBACK, ExperimentConfig, analyze
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


def experiment_create(
    tenant: Tenant,
    *,
    adapter: Adapter,
    candidate_version: AdapterVersion,
    actor: str,
    candidate_weight: float = 0.5,
    config: dict[str, Any] | None = None,
) -> Experiment:
    """A draft experiment of ``candidate_version`` against the adapter's production version."""
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


@dataclass
class ProbeCheck:
    replica: int  # its place in VLLM_BASE_URLS, from 1: tenants never see the replicas' addresses
    max_abs_diff: float | None
    ok: bool
    message: str


def serve_probe_verify(version: AdapterVersion) -> list[ProbeCheck]:
    """Ask every vLLM replica for the probe's log-probs under ``version`` and compare them with the
    trainer's. Raises Conflict (naming the replica and the gap) when one does not serve exactly
    these weights, or when the version has no probe to check."""
    from apps.serving.services import vllm_client

    probe = (version.metrics or {}).get("serve_probe")
    if not probe:
        raise Conflict(
            f"version {version.number} has no serve probe recorded, so Strop cannot check that vLLM serves its "
            "weights; register it with the trainer or `manage.py adapter_version_register` (which record one)",
            code="no_serve_probe",
        )
    tolerance = settings.STROP_PROBE_TOLERANCE
    client = vllm_client()
    checks: list[ProbeCheck] = []
    prompt, completion, expected = probe["prompt_token_ids"], probe["completion_token_ids"], probe["logprobs"]
    for index, replica in enumerate(client.base_urls, start=1):
        served = client.prompt_logprobs(replica, model=version.vllm_name, token_ids=[*prompt, *completion])
        tail = served[len(prompt) :]
        if len(tail) != len(expected) or any(v is None for v in tail):
            checks.append(ProbeCheck(index, None, False, "vLLM returned no log-prob for some probe tokens"))
            continue
        gap = max(abs(float(a) - float(b)) for a, b in zip(tail, expected, strict=True))
        ok = gap <= tolerance
        checks.append(ProbeCheck(index, gap, ok, "" if ok else f"max |Δ logprob| {gap:.4f} > {tolerance}"))
    failed = [c for c in checks if not c.ok]
    if failed:
        for check in failed:  # the operator's log names the replica; the tenant reads its number
            logger.warning(
                "serve probe of %s failed on replica %d (%s): %s",
                version.vllm_name, check.replica, client.base_urls[check.replica - 1], check.message,
            )
        details = "; ".join(f"replica {c.replica} of {len(checks)}: {c.message}" for c in failed)
        raise Conflict(
            f"vLLM does not serve version {version.number}'s weights: {details}. The experiment was not started.",
            code="serve_probe_mismatch",
            details={"checks": [c.__dict__ for c in checks], "tolerance": tolerance},
        )
    return checks


def _load_everywhere(version: AdapterVersion) -> None:
    from apps.serving.services import vllm_client

    vllm_client().load_adapter(version.vllm_name, version.artifact_path)  # every replica, idempotent
    if version.loaded_at is None:
        AdapterVersion.objects.filter(pk=version.pk, loaded_at__isnull=True).update(loaded_at=timezone.now())


def experiment_start(tenant: Tenant, *, experiment: Experiment, actor: str) -> Experiment:
    """Load the candidate on every replica, check vLLM serves exactly its weights, then start.

    Control is production at this moment. The salt is drawn here and never changes."""
    if experiment.status != Experiment.Status.DRAFT:
        raise Conflict(f"experiment {experiment.pk} is {experiment.status}; only a draft can start", code="not_draft")
    candidate = experiment.candidate_version
    _load_everywhere(candidate)
    checks = serve_probe_verify(candidate)
    try:
        with transaction.atomic():
            adapter = Adapter.objects.select_for_update(no_key=True).get(pk=experiment.adapter_id)
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
    """Move a running experiment to its end state (guarded: only one action ends it)."""
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
    _load_everywhere(candidate)
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


def adapter_rollback(tenant: Tenant, *, adapter: Adapter, to_version: AdapterVersion, actor: str) -> Adapter:
    """Move production back to an earlier good version of the adapter (any lower number that did
    not fail); a running experiment on the adapter is stopped first."""
    current = adapter.production_version
    if to_version.adapter_id != adapter.pk:
        raise ValidationFailed("version: belongs to another adapter")
    if to_version.status == AdapterVersion.Status.FAILED:
        raise Conflict(f"version {to_version.number} failed and cannot serve", code="version_failed")
    if current is not None and to_version.number >= current.number:
        raise Conflict(
            f"version {to_version.number} is not earlier than production (version {current.number})",
            code="not_earlier",
        )
    running = experiment_running_for(adapter)
    if running is not None:
        experiment_stop(tenant, experiment=running, actor=actor, reason=f"rollback to version {to_version.number}")
    _load_everywhere(to_version)
    to_version.refresh_from_db()
    with transaction.atomic():
        adapter = adapter_version_promote(tenant, version=to_version, actor=actor)
        audit_record(
            tenant,
            actor=actor,
            action="adapter.rollback",
            target_type="adapter",
            target_id=adapter.name,
            data={"from": current.vllm_name if current else None, "to": to_version.vllm_name},
        )
    return adapter


# ----------------------------------------------------------------------------- exposure


_exposed: dict[tuple[int, str], None] = {}  # per process: exposures already recorded (bounded below)
_EXPOSED_MAX = 200_000


def exposure_record(experiment: Experiment, *, external_id: str, arm: str) -> None:
    """Record that an opted-in user met the experiment, once per user (idempotent, race-safe)."""
    key = (experiment.pk, external_id)
    if key in _exposed:
        return
    user_id = (
        EndUser.objects.filter(tenant_id=experiment.tenant_id, external_id=external_id)
        .values_list("pk", flat=True)
        .first()
    )
    if user_id is None:
        return
    ExperimentExposure.objects.bulk_create(
        [
            ExperimentExposure(
                tenant_id=experiment.tenant_id,
                experiment=experiment,
                end_user_id=user_id,
                arm=arm,
                first_exposed_at=timezone.now(),
            )
        ],
        ignore_conflicts=True,
    )
    if len(_exposed) >= _EXPOSED_MAX:
        _exposed.clear()
    _exposed[key] = None


# ----------------------------------------------------------------------------- statistics


def experiment_snapshot_take(experiment_id: int) -> ExperimentSnapshot | None:
    """Compute and store the statistics of a running experiment, then act on the decision where
    the tenant chose automatic actions; an experiment past its maximum duration ends inconclusive."""
    from apps.experiments.arm_data import experiment_arm_data

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
    """Beat, every minute: a snapshot of every running experiment."""
    taken = []
    for experiment_id in Experiment.objects.filter(status=Experiment.Status.RUNNING).values_list("pk", flat=True):
        try:
            if experiment_snapshot_take(experiment_id) is not None:
                taken.append(experiment_id)
        except Exception:  # one experiment's failure must not stop the others' snapshots
            logger.exception("snapshot of experiment %s failed", experiment_id)
    return taken
