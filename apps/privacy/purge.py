"""Purging the weights of versions that learned from an erased end user.

An erase deletes the user's rows; the weights of the versions trained on their events still carry
what was learned. Once such a version is replaced (not production, in no draft or running
experiment, no active run trains from it), a tenant admin purges it: every object version of its
files is deleted from the adapter store (with bucket versioning on, a plain delete would only hide
them), the row stays as ``purged`` for the lineage and the audit. A version inherits what its
parent learned, so a descendant of a marked version is purgeable too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.store import StoreError, store_for
from apps.common.exceptions import Conflict, ServiceUnavailable
from apps.engines.vllm import vllm_client
from apps.engines.vllm_client import VLLMError, VLLMUnavailable
from apps.experiments.models import Experiment
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record
from apps.training.erasure import erased_users_per_version
from apps.training.models import ACTIVE_STATUSES, TrainingRun

logger = logging.getLogger(__name__)

OPEN_EXPERIMENT_STATUSES = (Experiment.Status.DRAFT, Experiment.Status.RUNNING)
HOW = "POST /v1/adapters/{adapter}/versions/{number}/purge, or Purge on the adapter's Versions page"


@dataclass(frozen=True)
class PurgeState:
    """Where one version's weights stand: ``purged``, ``purgeable``, ``in_use`` (``why``), or
    ``clean`` (it learned from no erased end user)."""

    state: str
    why: str = ""


def tainted_versions(adapter: Adapter, *, marked: set[int] | None = None) -> set[int]:
    """Ids of the adapter's versions that learned from an erased end user: marked ones (their run
    trained on one) and every version descending from them. Two queries."""
    marked = set(erased_users_per_version(adapter)) if marked is None else marked
    children: dict[int, list[int]] = {}
    for pk, parent in AdapterVersion.objects.filter(adapter=adapter).values_list("pk", "parent_id"):
        if parent is not None:
            children.setdefault(parent, []).append(pk)
    tainted, todo = set(), list(marked)
    while todo:
        pk = todo.pop()
        if pk not in tainted:
            tainted.add(pk)
            todo.extend(children.get(pk, []))
    return tainted


def _in_use(version: AdapterVersion) -> str:
    """Why ``version`` cannot be purged now, or ""."""
    adapter_production = Adapter.objects.filter(pk=version.adapter_id).values_list("production_version", flat=True)
    if adapter_production.first() == version.pk:
        return "it serves in production: promote or roll back to another version first"
    experiment = (
        Experiment.objects.filter(status__in=OPEN_EXPERIMENT_STATUSES)
        .filter(Q(candidate_version=version) | Q(control_version=version))
        .values_list("pk", flat=True)
        .first()
    )
    if experiment is not None:
        return f"experiment {experiment} uses it: stop the experiment first"
    run = TrainingRun.objects.filter(parent_version=version, status__in=ACTIVE_STATUSES).values_list("pk", flat=True)
    if run.first() is not None:
        return f"training run {run.first()} trains from it: purge it once the run ends"
    return ""


def version_purge_states(adapter: Adapter) -> dict[int, PurgeState]:
    """Version id -> its PurgeState, for the versions that learned from an erased user (others are
    left out: clean)."""
    states: dict[int, PurgeState] = {}
    versions = AdapterVersion.objects.filter(pk__in=tainted_versions(adapter)).order_by("number")
    for version in versions:
        if version.status == AdapterVersion.Status.PURGED:
            states[version.pk] = PurgeState("purged")
        else:
            why = _in_use(version)
            states[version.pk] = PurgeState("in_use", why) if why else PurgeState("purgeable")
    return states


def adapter_version_purge(tenant: Tenant, *, version: AdapterVersion, actor: str) -> AdapterVersion:
    """Delete every stored copy of ``version``'s weights and mark it purged; audited. Idempotent (a
    purged version is returned as it is). 409 when it learned from no erased user or is in use."""
    if version.tenant_id != tenant.pk:
        raise ValueError("version belongs to another tenant")
    with transaction.atomic():
        # The adapter's row first (promotion and rollback lock it too), so production cannot move
        # onto this version while it is being purged.
        adapter = Adapter.objects.select_for_update(no_key=True).get(pk=version.adapter_id, tenant=tenant)
        version = AdapterVersion.objects.select_for_update(no_key=True).get(pk=version.pk)
        if version.status == AdapterVersion.Status.PURGED:
            return version
        if version.pk not in tainted_versions(adapter):
            raise Conflict(
                f"version {version.number} learned from no erased end user; only those are purged",
                code="not_trained_on_erased_user",
            )
        why = _in_use(version)
        if why:
            raise Conflict(f"version {version.number} cannot be purged now: {why}", code="version_in_use")
        try:
            deleted = store_for(version.artifact_path).purge(version.artifact_path)
        except StoreError as exc:
            raise ServiceUnavailable(f"version {version.number}'s weights could not be purged: {exc}") from None
        version.status, version.purged_at, version.loaded_at = AdapterVersion.Status.PURGED, timezone.now(), None
        version.save(update_fields=["status", "purged_at", "loaded_at"])
        audit_record(
            tenant,
            actor=actor,
            action="adapter_version.purge",
            target_type="adapter_version",
            target_id=version.vllm_name,
            data={"adapter": adapter.name, "version": version.number, "objects_deleted": deleted},
        )
    try:  # vLLM may still hold it in memory; a replica down now drops it at restart
        vllm_client().unload_adapter(version.vllm_name)
    except (VLLMError, VLLMUnavailable) as exc:
        logger.warning("purged %s, but unloading it from vLLM failed: %s", version.vllm_name, exc)
    return version


BACKUPS = (
    "until the operator's backups taken before the erase age out: Postgres dumps or archived WAL and "
    "copies of the adapter store (docs/security.md: erase)"
)
REPLICA_CACHES = (
    "until each vLLM replica's adapter cache drops the purged versions (STROP_VLLM_ADAPTER_CACHE; a purge "
    "unloads them from vLLM, and a replica restarted with an empty cache holds none)"
)


def erased_user_remains(tenant: Tenant, *, trained_on: list[dict[str, object]]) -> list[dict[str, object]]:
    """What still holds something learned from an erased user once their rows are gone, and until
    when: each version trained on them or descending from one (its weights' state), then copies
    outside Strop's reach. Call after the erase's marks are recorded."""
    remains: list[dict[str, object]] = []
    for name in sorted({str(v["adapter"]) for v in trained_on}):
        adapter = Adapter.objects.filter(tenant=tenant, name=name).first()
        if adapter is None:
            continue
        direct = {int(str(v["version"])) for v in trained_on if v["adapter"] == name}
        ids = dict(AdapterVersion.objects.filter(adapter=adapter, number__in=direct).values_list("pk", "number"))
        carrying = tainted_versions(adapter, marked=set(ids))
        states = version_purge_states(adapter)
        numbers = dict(AdapterVersion.objects.filter(pk__in=carrying).values_list("pk", "number"))
        for pk in sorted(carrying, key=numbers.__getitem__):
            state = states.get(pk, PurgeState("purgeable"))
            how = HOW.format(adapter=name, number=numbers[pk])
            until = {
                "purged": "gone: purged from the adapter store",
                "purgeable": f"until purged: {how}",
                "in_use": f"until it is replaced and purged ({state.why}); then {how}",
            }[state.state]
            remains.append(
                {"kind": "weights", "adapter": name, "version": numbers[pk], "state": state.state, "until": until}
            )
    if remains:
        remains.append({"kind": "vllm_replica_caches", "until": REPLICA_CACHES})
    remains.append({"kind": "backups", "until": BACKUPS})
    return remains
