from __future__ import annotations

import uuid

import pytest

from apps.adapters.models import BaseModel
from apps.adapters.services import adapter_create, adapter_version_register, base_model_register
from apps.serving.services import adapter_version_load


@pytest.fixture
def base_model(served, db) -> BaseModel:
    return base_model_register(name=served.served_model_name, path=served.model_dir)


@pytest.fixture
def serving_tenant(make_tenant):
    # vLLM outlives each test's database: a fresh slug per test keeps names apart.
    return make_tenant(f"t-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def serving_adapter(serving_tenant, base_model):
    return adapter_create(serving_tenant, name="autocomplete", base_model=base_model, is_default=True)


@pytest.fixture
def serve_client(serving_tenant, make_client):
    return make_client(serving_tenant, scopes=["serve", "feedback"])


@pytest.fixture
def loaded_version(serving_tenant, serving_adapter, make_lora_adapter):
    """``make(seed, parent=None)``: register a random LoRA as a new version and load it in vLLM."""

    def make(seed: int, parent=None, rank: int = 8):
        version = adapter_version_register(
            serving_tenant,
            adapter=serving_adapter,
            source_dir=make_lora_adapter(seed=seed, rank=rank),
            parent=parent,
            enqueue_load=False,
        )
        assert adapter_version_load(version_id=version.pk) == "loaded"
        version.refresh_from_db()
        return version

    return make
