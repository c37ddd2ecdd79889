"""Serving: which version answers a request, and getting versions into vLLM.

Every adapter version has its own vLLM name and directory, so moving the production pointer
is one row update: a request resolves its version once, at its start, and finishes on it.
The completion itself is served by :mod:`apps.serving.completions`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.services import adapter_version_mark_failed, adapter_version_mark_loaded
from apps.common.observability.metrics import adapter_load_counted
from apps.serving.vllm_client import (
    AdapterRejected,
    VLLMClient,
    VLLMError,
    VLLMUnavailable,
)
from apps.tenants.models import Tenant

if TYPE_CHECKING:
    from apps.experiments.models import Experiment


@functools.cache
def _client(urls: tuple[str, ...], timeout: float, api_key: str) -> VLLMClient:
    return VLLMClient(list(urls), timeout=timeout, api_key=api_key)


def vllm_client() -> VLLMClient:
    return _client(tuple(settings.VLLM_BASE_URLS), settings.VLLM_TIMEOUT_S, settings.VLLM_API_KEY)


@dataclass(frozen=True)
class Route:
    """What serves one request: a version (None = the base model alone) and the experiment arm."""

    adapter: Adapter
    version: AdapterVersion | None
    arm: str = ""
    experiment: Any = None  # the running Experiment that chose the arm, if any

    @property
    def vllm_model(self) -> str:
        return self.version.vllm_name if self.version is not None else self.adapter.base_model.name

    def recorded(self) -> dict[str, Any]:
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
    from apps.experiments.assignment import assign_arm
    from apps.experiments.services import exposure_record

    version = adapter.production_version
    if version is not None and version.status == AdapterVersion.Status.FAILED:
        version = None  # never route to a version vLLM refused; the base model still answers
    if opted_in and end_user_id:
        if running is not None:
            arm = assign_arm(running.salt, end_user_id, candidate_weight=running.candidate_weight)
            exposure_record(running, external_id=end_user_id, arm=arm)
            return Route(adapter=adapter, version=running.version_of(arm), arm=arm, experiment=running)
    return Route(adapter=adapter, version=version)


def adapter_version_load(*, version_id: int) -> str:
    """Load a version on every replica; a refusal marks it failed with vLLM's message."""
    version = AdapterVersion.objects.select_related("tenant").get(pk=version_id)
    if version.status == AdapterVersion.Status.FAILED:
        return "failed"
    try:
        vllm_client().load_adapter(version.vllm_name, version.artifact_path)
    except AdapterRejected as exc:
        adapter_load_counted("rejected")
        adapter_version_mark_failed(version, message=f"vLLM refused the adapter: {exc.message}")
        return "failed"
    except VLLMUnavailable:
        adapter_load_counted("unavailable")
        raise
    except VLLMError:
        adapter_load_counted("error")
        raise
    adapter_load_counted("loaded")
    adapter_version_mark_loaded(version)
    return "loaded"
