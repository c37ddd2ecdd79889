"""For tenants that serve elsewhere: which version an end user should get now, as serving would
route them, without generating anything."""

from __future__ import annotations

from dataclasses import dataclass

from apps.cohorts.selectors import consent_default
from apps.cohorts.services import end_user_consent_now
from apps.serving.selectors import serving_lookup
from apps.serving.services import serving_route
from apps.tenants.models import ApiKey, Tenant


@dataclass(frozen=True)
class Assignment:
    adapter: str
    user: str
    opted_in: bool
    experiment: int | None
    arm: str | None
    version: int | None
    model: str  # the vLLM name of the version to serve


def serving_assignment(
    tenant: Tenant, *, adapter_name: str, user: str, flag: bool | None, api_key: ApiKey | None, actor: str
) -> Assignment:
    """Records the user's consent (``flag``, or the default for a user seen for the first time);
    an opted-in user of the adapter's running experiment gets their arm, and the exposure is
    recorded; everyone else gets production."""
    found = serving_lookup(tenant, name=adapter_name, external_id=user)
    adapter = found.adapter
    consent = end_user_consent_now(
        tenant,
        external_id=user,
        flag=flag,
        default=consent_default(tenant, api_key=api_key),
        actor=actor,
        stored=found.end_user,
    )
    route = serving_route(
        tenant, adapter=adapter, end_user_id=user, opted_in=consent, running=found.experiment, stored=found.end_user
    )
    experiment, version = route.experiment, route.version  # the one routing rule serving follows
    return Assignment(
        adapter=adapter.name,
        user=user,
        opted_in=consent,
        experiment=experiment.pk if experiment is not None else None,
        arm=route.arm or None,
        version=version.number if version is not None else None,
        model=version.vllm_name if version is not None else adapter.base_model.name,
    )
