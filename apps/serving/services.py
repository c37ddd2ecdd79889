"""Serving: which version answers a request.

Every adapter version has its own vLLM name and directory, so moving the production pointer
is one row update: a request resolves its version once, at its start, and finishes on it.
Loading versions into vLLM is :mod:`apps.adapters.loading`; the completion itself is served by
:mod:`apps.serving.completions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.adapters.models import Adapter, AdapterVersion
from apps.experiments.assignment import assign_arm
from apps.experiments.models import Experiment
from apps.experiments.services import exposure_record
from apps.tenants.models import Tenant


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
    tenant: Tenant, *, adapter: Adapter, end_user_id: str, opted_in: bool, running: Experiment | None
) -> Route:
    """Production, or for an opted-in end user the arm of the adapter's running experiment.

    Only opted-in users are randomised (one rule with training: apps.cohorts.selectors); their
    arm is a hash of the experiment's salt and their id, so it never moves; the exposure is
    recorded once. Everyone else gets production. ``running``: the adapter's running experiment
    or None, as the request read it (``serving_lookup``)."""
    version = adapter.production_version
    if version is not None and version.status == AdapterVersion.Status.FAILED:
        version = None  # never route to a version vLLM refused; the base model still answers
    if opted_in and end_user_id:
        if running is not None:
            arm = assign_arm(running.salt, end_user_id, candidate_weight=running.candidate_weight)
            exposure_record(running, external_id=end_user_id, arm=arm)
            return Route(adapter=adapter, version=running.version_of(arm), arm=arm, experiment=running)
    return Route(adapter=adapter, version=version)
