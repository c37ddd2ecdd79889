"""Serving: which version answers a request.

Every adapter version has its own vLLM name and directory, so moving the production pointer
is one row update: a request resolves its version once, at its start, and finishes on it.
Loading versions into vLLM is :mod:`apps.adapters.loading`; the completion itself is served by
:mod:`apps.serving.completions`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from apps.adapters.models import Adapter, AdapterVersion
from apps.cohorts.models import EndUser
from apps.cohorts.selectors import consent_default
from apps.cohorts.services import end_user_consent_now
from apps.common.exceptions import Conflict
from apps.experiments.assignment import ARMS, HOLDOUT, assign_arm, in_holdout
from apps.experiments.models import Experiment
from apps.experiments.services import experiment_stop, exposure_record
from apps.interactions.served import SERVED_BY_KEY
from apps.serving.selectors import ReadAhead, serving_lookup
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.ratelimit import Work, rate_limit_check, serving_units

logger = logging.getLogger(__name__)


def served_by(api_key: ApiKey | None) -> dict[str, str]:
    """What a served interaction records of the key that asked for it: its public prefix, so that
    an editor key's feedback reaches only what it served (apps.interactions.services.feedback)."""
    return {SERVED_BY_KEY: api_key.prefix} if api_key is not None else {}


@dataclass(frozen=True)
class Route:
    """What serves one request: a version (None = the base model alone) and the experiment arm."""

    adapter: Adapter
    version: AdapterVersion | None
    arm: str = ""
    experiment: Experiment | None = None  # the running experiment that chose the arm, if any

    @property
    def vllm_model(self) -> str:
        return self.version.vllm_name if self.version is not None else self.adapter.base_model.name

    def recorded(self) -> dict[str, object]:
        """The columns a served interaction keeps of its route (interactions_record_served)."""
        return {
            "model_name": self.vllm_model,
            "adapter_id": self.adapter.pk,
            "adapter_version_id": self.version.pk if self.version is not None else None,
            "experiment_id": self.experiment.pk if self.experiment is not None else None,
            "experiment_arm": self.arm,
        }


def serving_route(
    tenant: Tenant,
    *,
    adapter: Adapter,
    end_user_id: str,
    opted_in: bool,
    running: Experiment | None,
    stored: EndUser | None = None,
) -> Route:
    """Production, or for an opted-in end user the arm of the adapter's running experiment.

    Only opted-in users are randomised (one rule with training: apps.cohorts.selectors); their
    arm is a hash of the experiment's salt and their id, so it never moves; the exposure is
    recorded once. Everyone else gets production. ``running``: the adapter's running experiment
    or None, and ``stored``: the end user's row (None: not stored before this request), as the
    request read them (``serving_lookup``).

    A version that failed is never routed to: production falls back to the base model, and an
    experiment one of whose arms failed is stopped (``experiment_stop_on_failed_version``) while
    this request is served as if outside it, attributed to no arm and recording no exposure."""
    version = adapter.production_version
    if version is not None and version.status == AdapterVersion.Status.FAILED:
        version = None  # never route to a version vLLM refused; the base model still answers
    if running is not None:
        failed = next((v for v in _arm_versions(running) if v.status == AdapterVersion.Status.FAILED), None)
        if failed is not None:
            experiment_stop_on_failed_version(tenant, experiment=running, version=failed)
            running = None
    if opted_in and end_user_id:
        if in_holdout(adapter_id=adapter.pk, share=adapter.holdout_share, external_id=end_user_id):
            return Route(adapter=adapter, version=None, arm=HOLDOUT)  # the base model, across promotions
        if running is not None:
            arm = assign_arm(running.salt, end_user_id, candidate_weight=running.candidate_weight)
            row = stored.pk if stored is not None else None
            exposure_record(running, external_id=end_user_id, arm=arm, end_user_id=row)
            return Route(adapter=adapter, version=running.version_of(arm), arm=arm, experiment=running)
    return Route(adapter=adapter, version=version)


def _arm_versions(experiment: Experiment) -> list[AdapterVersion]:
    """The versions the experiment's arms serve (the base model, which cannot fail, left out)."""
    return [v for v in (experiment.version_of(arm) for arm in ARMS) if v is not None]


def experiment_stop_on_failed_version(tenant: Tenant, *, experiment: Experiment, version: AdapterVersion) -> None:
    """Stop a running experiment whose arm serves ``version``, which failed (vLLM refused it, or its
    files did not match their digest): that arm cannot answer, so its users would get errors the
    experiment never counts, and the other arm's data alone compares nothing. The reason (vLLM's
    message) is the experiment's ``decision_reason`` and its audit row, as a person's stop would be.
    One that ended meanwhile (another request stopped it first) is left as it is."""
    if experiment.status != Experiment.Status.RUNNING:
        return
    arm = next((a for a in ARMS if experiment.version_of(a) == version), "")
    reason = f"the {arm} arm's version {version.number} failed and cannot serve"
    if version.status_message:
        reason += f": {version.status_message}"
    try:
        experiment_stop(tenant, experiment=experiment, actor="system:serving", reason=reason[:2000])
    except Conflict as exc:
        logger.info("experiment %s was not stopped for its failed version: %s", experiment.pk, exc.message)
    else:
        logger.warning("experiment %s stopped: %s", experiment.pk, reason)


@dataclass(frozen=True)
class Routed:
    """What every serving request settles first: its adapter, end user, their consent now, route."""

    adapter: Adapter
    user: str
    opted_in: bool
    route: Route


def serving_request_route(
    tenant: Tenant,
    *,
    model: str | None,
    user: str,
    flag: bool | None,
    api_key: ApiKey | None,
    actor: str,
    ahead: ReadAhead | None = None,
    sequences: int = 1,
    max_tokens: int | None = None,
) -> Routed:
    """The adapter ``model`` names (404 for another tenant's; None: the default), the end user's
    consent now (``flag`` as the request states it, else what is stored, else the key's default),
    and the route. What is stored of them was read with the API key (``ahead``), or is read now in
    one round trip (``serving_lookup``).

    Before anything is written (consent, exposure), the request is charged its work against the
    tenant's rate limit: ``sequences`` (n, or best_of) x ``max_tokens`` as it will be served (at
    most the adapter's limit; its limit when the client named none), one unit of which the API
    key's check already took."""
    found = serving_lookup(tenant, name=model, external_id=user, ahead=ahead)
    limit = found.adapter.max_completion_tokens
    served_tokens = min(max_tokens, limit) if max_tokens is not None else limit
    units = serving_units(sequences, served_tokens)
    if units > 1:
        work = Work(units=units, n=sequences, max_tokens=served_tokens)
        rate_limit_check(tenant, cost=units - 1, work=work)
    consent = end_user_consent_now(
        tenant,
        external_id=user,
        flag=flag,
        default=consent_default(tenant, api_key=api_key),
        actor=actor,
        stored=found.end_user,
    )
    route = serving_route(
        tenant,
        adapter=found.adapter,
        end_user_id=user,
        opted_in=consent,
        running=found.experiment,
        stored=found.end_user,
    )
    return Routed(adapter=found.adapter, user=user, opted_in=consent, route=route)
