"""Moving production by hand: the adapter's pointer to a version an admin or operator names, or back
to an earlier good one, deciding or stopping the adapter's running experiment first (it compares
against production, which is about to change)."""

from __future__ import annotations

from django.db import transaction

from apps.adapters.loading import adapter_version_load, adapter_version_load_everywhere
from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.services import adapter_version_promote
from apps.common.exceptions import Conflict, ValidationFailed
from apps.experiments.selectors import experiment_running_for
from apps.experiments.services.lifecycle import experiment_promote, experiment_stop
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record


def adapter_rollback(
    tenant: Tenant, *, adapter: Adapter, to_version: AdapterVersion, actor: str, only_from: AdapterVersion | None = None
) -> Adapter:
    """Move production back to an earlier good version of the adapter (any lower number that did
    not fail); a running experiment on the adapter is stopped first. ``only_from``: only while that
    version is production (an alarm's rollback). Production is read from the database, and read
    again under the adapter's lock before it moves: one that moved meanwhile is a 409."""
    pointer = Adapter.objects.values_list("production_version_id", flat=True).get(pk=adapter.pk)
    current = AdapterVersion.objects.filter(pk=pointer).first() if pointer is not None else None
    if only_from is not None and current != only_from:
        raise Conflict(f"production is no longer version {only_from.number}; nothing was rolled back")
    if to_version.adapter_id != adapter.pk:
        raise ValidationFailed("version: belongs to another adapter")
    if to_version.status == AdapterVersion.Status.FAILED:
        raise Conflict(f"version {to_version.number} failed and cannot serve", code="version_failed")
    if to_version.status == AdapterVersion.Status.PURGED:
        raise Conflict(f"version {to_version.number}'s weights were purged; it cannot serve", code="version_purged")
    if current is not None and to_version.number >= current.number:
        raise Conflict(
            f"version {to_version.number} is not earlier than production (version {current.number})",
            code="not_earlier",
        )
    adapter_version_load_everywhere(to_version)  # before anything changes: a load that fails changes nothing
    to_version.refresh_from_db()
    with transaction.atomic():
        locked = Adapter.objects.select_for_update(no_key=True)  # as a promotion locks it: served rows' keys pass
        now = locked.values_list("production_version_id", flat=True).get(pk=adapter.pk)
        if now != (current.pk if current is not None else None):
            raise Conflict("production moved while the rollback loaded its version; nothing was rolled back")
        # Read under the adapter's lock (a start takes it too): one started while the version loaded
        # is stopped as well; and a rollback refused below leaves the experiment running.
        running = experiment_running_for(adapter)
        if running is not None:
            experiment_stop(tenant, experiment=running, actor=actor, reason=f"rollback to version {to_version.number}")
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


def adapter_promote(tenant: Tenant, *, version: AdapterVersion, actor: str) -> Adapter:
    """Make ``version`` production by hand (the API, the dashboard, the operator's command), loading
    it into vLLM first when it is not loaded. The adapter's running experiment would otherwise keep
    serving its control arm a retired version and later promote its candidate over this one, never
    compared with it: promoting the experiment's candidate decides the experiment (promote), and any
    other version stops it first."""
    if version.loaded_at is None and version.status != AdapterVersion.Status.FAILED:
        adapter_version_load(version_id=version.pk)
        version.refresh_from_db()
    adapter = version.adapter
    running = experiment_running_for(adapter)
    if running is not None and running.candidate_version_id == version.pk:
        experiment_promote(tenant, experiment=running, actor=actor, reason="promoted by hand")
        return Adapter.objects.get(pk=adapter.pk)
    with transaction.atomic():  # the experiment stops only with the promotion: one refused leaves it running
        locked = Adapter.objects.select_for_update(no_key=True)  # as a start locks it
        production = locked.values_list("production_version_id", flat=True).get(pk=adapter.pk)
        running = experiment_running_for(adapter) if production != version.pk else None  # production already: no-op
        if running is not None:
            reason = f"version {version.number} promoted by hand"
            experiment_stop(tenant, experiment=running, actor=actor, reason=reason)
            version.refresh_from_db()  # the stop set the experiment's versions' statuses
        return adapter_version_promote(tenant, version=version, actor=actor)
