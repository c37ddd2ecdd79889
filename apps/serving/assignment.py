"""For tenants that serve elsewhere: which version an end user should get now, as serving would
route them, without generating anything."""

from __future__ import annotations

from dataclasses import dataclass

from apps.cohorts.selectors import consent_default
from apps.cohorts.services import end_user_consent_now
from apps.experiments.assignment import HOLDOUT, assign_arm, in_holdout
from apps.experiments.services import exposure_record
from apps.serving.selectors import serving_lookup
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
    experiment = found.experiment if consent else None
    arm, version = None, adapter.production_version
    if consent and in_holdout(adapter_id=adapter.pk, share=adapter.holdout_share, external_id=user):
        arm, version, experiment = HOLDOUT, None, None  # the base model, across promotions
    elif experiment is not None:
        arm = assign_arm(experiment.salt, user, candidate_weight=experiment.candidate_weight)
        exposure_record(experiment, external_id=user, arm=arm)
        version = experiment.version_of(arm)
    return Assignment(
        adapter=adapter.name,
        user=user,
        opted_in=consent,
        experiment=experiment.pk if experiment is not None else None,
        arm=arm,
        version=version.number if version is not None else None,
        model=version.vllm_name if version is not None else adapter.base_model.name,
    )
