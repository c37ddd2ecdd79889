"""A vLLM replica gets adapter versions from the object store by itself
(platform/vllm_plugins/strop_vllm_store.py), both when Strop loads one and when a request names a
version the replica never loaded. The store is moto's server mode (tests/fixtures/object_store.py),
standing in for S3, which nothing here provides; vLLM is the real CPU build.
"""

from __future__ import annotations

import httpx
import pytest
from django.test import override_settings

from apps.adapters.loading import adapter_version_load, serve_probe_verify
from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_serve_probe, adapter_version_register
from apps.adapters.store import MANIFEST, manifest_of
from tests.fixtures.vllm import start_vllm_server, stop_vllm_server

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_replica_fetches_versions_from_the_store_checks_them_and_keeps_vllms_refusals(
    settings, s3_store, object_store, tenant, adapter, make_lora_adapter, tiny_starter_model, tmp_path
):
    cache = tmp_path / "replica-cache"
    env = {**object_store.env(s3_store), "STROP_VLLM_ADAPTER_CACHE": str(cache)}
    proc, server = start_vllm_server(tiny_starter_model, tmp_path / "vllm.log", extra_env=env)
    try:
        settings.VLLM_BASE_URLS = [server.base_url]
        settings.VLLM_MAX_LORA_RANK = server.max_lora_rank

        # Strop loads a version by its store address; the replica fetches it into its own cache.
        source = make_lora_adapter(seed=21)
        probe = adapter_serve_probe(adapter.base_model, source)
        loaded = adapter_version_register(
            tenant, adapter=adapter, source_dir=source, enqueue_load=False, metrics={"serve_probe": probe}
        )
        assert loaded.artifact_path.startswith("s3://")
        assert adapter_version_load(version_id=loaded.pk) == "loaded", server.log_tail()
        assert manifest_of(cache / loaded.vllm_name) == manifest_of(source)
        assert (cache / loaded.vllm_name / MANIFEST).is_file()
        assert [check.ok for check in serve_probe_verify(loaded)] == [True]  # vLLM serves exactly its weights

        # A version the replica was never told about is fetched when a request names it.
        unseen = adapter_version_register(
            tenant, adapter=adapter, source_dir=make_lora_adapter(seed=22), enqueue_load=False
        )
        body = {"model": unseen.vllm_name, "prompt": "def add(a, b):\n", "max_tokens": 4, "temperature": 0}
        answer = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=server.headers, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == unseen.vllm_name
        assert (cache / unseen.vllm_name).is_dir()

        # A name the store does not hold is vLLM's ordinary 404, and nothing is cached for it.
        body["model"] = "acme--autocomplete--v99-00000000"
        missing = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=server.headers, timeout=60)
        assert missing.status_code == 404
        assert not (cache / body["model"]).exists()

        # vLLM's own refusal still reaches Strop through the fetch: rank 32 above the replica's 16.
        with override_settings(VLLM_MAX_LORA_RANK=64):
            too_big = adapter_version_register(
                tenant, adapter=adapter, source_dir=make_lora_adapter(seed=23, rank=32), enqueue_load=False
            )
        assert adapter_version_load(version_id=too_big.pk) == "failed"
        too_big.refresh_from_db()
        assert too_big.status == AdapterVersion.Status.FAILED and "rank" in too_big.status_message.lower()
    finally:
        stop_vllm_server(proc)
