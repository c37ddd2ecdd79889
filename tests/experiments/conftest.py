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
