from __future__ import annotations

import pytest


@pytest.fixture
def probed_version(serving_tenant, serving_adapter, make_lora_adapter, base_model):
    """``make(seed, parent=None)``: a random LoRA registered as a candidate, loaded in vLLM, with the
    serve probe the trainer would have recorded."""
    from apps.adapters.loading import adapter_version_load
    from apps.adapters.services import adapter_serve_probe, adapter_version_register

    def make(seed: int, parent=None):
        source = make_lora_adapter(seed=seed)
        probe = adapter_serve_probe(base_model, source)
        version = adapter_version_register(
            serving_tenant,
            adapter=serving_adapter,
            source_dir=source,
            parent=parent,
            enqueue_load=False,
            metrics={"serve_probe": probe},
        )
        assert adapter_version_load(version_id=version.pk) == "loaded"
        version.refresh_from_db()
        return version

    return make


@pytest.fixture
def make_running_experiment():
    """``make(tenant, name, is_default=False)``: a running experiment of a version 1 (no files, not
    loaded) against the base model, on an adapter ``name`` of a base model of its own."""
    from django.utils import timezone

    from apps.adapters.models import Adapter, AdapterVersion, BaseModel
    from apps.experiments.models import Experiment

    def make(tenant, name: str, *, is_default: bool = False) -> Experiment:
        base = BaseModel.objects.create(name=f"{name}-base", path="/nonexistent", family="qwen")
        adapter = Adapter.objects.create(tenant=tenant, name=name, base_model=base, is_default=is_default)
        candidate = AdapterVersion.objects.create(
            tenant=tenant,
            adapter=adapter,
            number=1,
            artifact_path=f"/x/{name}",
            vllm_name=f"t--{name}--v1",
            status="in_experiment",
        )
        return Experiment.objects.create(
            tenant=tenant,
            adapter=adapter,
            candidate_version=candidate,
            salt="s",
            status="running",
            started_at=timezone.now(),
            created_by="test",
        )

    return make
