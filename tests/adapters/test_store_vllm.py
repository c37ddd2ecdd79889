"""A vLLM replica gets adapter versions from the object store by itself
(platform/vllm_plugins/strop_vllm_store.py) when Strop loads one, checked against the digest Strop
recorded; and it checks the key (platform/vllm_plugins/strop_vllm_auth.py) before it reads a
request or touches the store. The store is moto's server mode (tests/fixtures/object_store.py),
standing in for S3, which nothing here provides; vLLM is the real CPU build. One replica serves the
whole module (a launch costs a minute or two), on a bucket of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.test import override_settings

from apps.adapters.loading import adapter_version_load, serve_probe_verify
from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_serve_probe, adapter_version_register
from apps.adapters.store import MANIFEST, manifest_of
from apps.engines.vllm import vllm_client
from tests.fixtures.object_store import ObjectStore
from tests.fixtures.vllm import VLLMServer, start_vllm_server, stop_vllm_server

pytestmark = pytest.mark.django_db(transaction=True)

MAX_BODY_BYTES = 256 * 1024  # the replica's VLLM_MAX_BODY_BYTES here; Strop's own requests are far smaller


@dataclass(frozen=True)
class StoreReplica:
    server: VLLMServer
    url: str  # the bucket's s3:// address
    cache: Path  # the replica's STROP_VLLM_ADAPTER_CACHE

    def cached(self) -> set[str]:
        return {p.name for p in self.cache.iterdir() if not p.name.startswith(".")} if self.cache.exists() else set()


@pytest.fixture(scope="module")
def store_replica(
    object_store: ObjectStore, tiny_starter_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StoreReplica]:
    url = f"s3://{object_store.new_bucket()}/adapters"
    cache = tmp_path_factory.mktemp("replica") / "cache"
    env = {
        **object_store.env(url),
        "STROP_VLLM_ADAPTER_CACHE": str(cache),
        "VLLM_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    }
    proc, server = start_vllm_server(tiny_starter_model, tmp_path_factory.mktemp("vllm") / "vllm.log", extra_env=env)
    try:
        yield StoreReplica(server=server, url=url, cache=cache)
    finally:
        stop_vllm_server(proc)


@pytest.fixture
def replica(settings, object_store: ObjectStore, store_replica: StoreReplica) -> StoreReplica:
    """Strop (this process) pointed at the replica and its bucket."""
    for name, value in object_store.env(store_replica.url).items():
        setattr(settings, name, value)
    settings.VLLM_BASE_URLS = [store_replica.server.base_url]
    settings.VLLM_MAX_LORA_RANK = store_replica.server.max_lora_rank
    return store_replica


def _completion(server: VLLMServer, model: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"model": model, "prompt": "def add(a, b):\n", "max_tokens": 4, "temperature": 0}
    return httpx.post(
        f"{server.base_url}/v1/completions",
        json=body,
        headers=server.headers if headers is None else headers,
        timeout=120,
    )


def test_a_replica_fetches_versions_strop_loads_checks_them_and_keeps_vllms_refusals(
    replica, tenant, adapter, make_lora_adapter
):
    server, cache = replica.server, replica.cache

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

    # A version the replica was never told about is not fetched when a request names it: vLLM gives
    # the resolver no digest, so it is vLLM's 404 (Strop then loads it with its digest, and retries).
    unseen = adapter_version_register(
        tenant, adapter=adapter, source_dir=make_lora_adapter(seed=22), enqueue_load=False
    )
    assert _completion(server, unseen.vllm_name).status_code == 404
    assert unseen.vllm_name not in replica.cached()
    assert adapter_version_load(version_id=unseen.pk) == "loaded", server.log_tail()
    answer = _completion(server, unseen.vllm_name)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == unseen.vllm_name

    # Once verified on this replica, the resolver serves it again from the cache (as after a restart).
    vllm_client().unload_adapter(unseen.vllm_name)
    again = _completion(server, unseen.vllm_name)
    assert again.status_code == 200, again.text

    # A load by store address without Strop's digest is refused: nothing unverifiable is served.
    bare = adapter_version_register(tenant, adapter=adapter, source_dir=make_lora_adapter(seed=24), enqueue_load=False)
    refused = httpx.post(
        f"{server.base_url}/v1/load_lora_adapter",
        json={"lora_name": bare.vllm_name, "lora_path": bare.artifact_path},
        headers=server.headers,
        timeout=60,
    )
    assert refused.status_code == 400 and "digest" in refused.json()["error"]["message"]
    assert bare.vllm_name not in replica.cached()

    # A name the store does not hold is vLLM's ordinary 404, and nothing is cached for it.
    missing_name = "acme--autocomplete--v99-00000000"
    assert _completion(server, missing_name).status_code == 404
    assert missing_name not in replica.cached()

    # vLLM's own refusal still reaches Strop through the fetch: rank 32 above the replica's 16.
    with override_settings(VLLM_MAX_LORA_RANK=64):
        too_big = adapter_version_register(
            tenant, adapter=adapter, source_dir=make_lora_adapter(seed=23, rank=32), enqueue_load=False
        )
    assert adapter_version_load(version_id=too_big.pk) == "failed"
    too_big.refresh_from_db()
    assert too_big.status == AdapterVersion.Status.FAILED and "rank" in too_big.status_message.lower()


def test_without_the_key_every_request_gets_the_same_401_and_nothing_is_fetched(
    replica, tenant, adapter, make_lora_adapter
):
    server = replica.server
    stored = adapter_version_register(
        tenant, adapter=adapter, source_dir=make_lora_adapter(seed=31), enqueue_load=False
    )
    missing_name = "acme--autocomplete--v98-00000000"
    missing_path = f"{replica.url}/{missing_name}"
    answers = []
    for headers in ({}, {"Authorization": "Bearer wrong-key"}):
        for name, path in ((stored.vllm_name, stored.artifact_path), (missing_name, missing_path)):
            load = {"lora_name": name, "lora_path": path, "strop_digest": stored.digest}
            answers.append(httpx.post(f"{server.base_url}/v1/load_lora_adapter", json=load, headers=headers))
            answers.append(_completion(server, name, headers=headers))
    assert {a.status_code for a in answers} == {401}
    assert len({a.content for a in answers}) == 1  # an existing name and a missing one read the same
    assert stored.vllm_name not in replica.cached()  # the replica downloaded nothing
    assert not (replica.cache / ".strop-verified" / stored.vllm_name).exists()


def test_bodies_over_the_cap_get_413_with_or_without_a_content_length(replica):
    server = replica.server
    url = f"{server.base_url}/v1/completions"
    oversize = json.dumps({"model": "base", "prompt": "x" * (MAX_BODY_BYTES + 1024), "max_tokens": 1}).encode()
    declared = httpx.post(url, content=oversize, headers={**server.headers, "content-type": "application/json"})
    assert declared.status_code == 413, declared.text
    assert "VLLM_MAX_BODY_BYTES" in declared.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no content-length: Transfer-Encoding: chunked
        for start in range(0, len(oversize), 16 * 1024):
            yield oversize[start : start + 16 * 1024]

    chunked = httpx.post(url, content=chunks(), headers={**server.headers, "content-type": "application/json"})
    assert "content-length" not in chunked.request.headers
    assert chunked.status_code == 413, chunked.text

    # The load endpoint (read by the store's middleware) is capped the same way, and the key still comes first.
    load = f"{server.base_url}/v1/load_lora_adapter"
    assert httpx.post(load, content=oversize, headers=server.headers).status_code == 413
    assert httpx.post(load, content=oversize).status_code == 401
    assert _completion(server, "base").status_code == 200  # the replica serves on


def _tamper(
    object_store: ObjectStore, replica: StoreReplica, version: AdapterVersion, weights_from: Path, *, forge: bool
) -> None:
    """Swap the version's weights in the bucket, as anyone with write access to it could."""
    client = object_store.client()
    bucket, _, prefix = replica.url.removeprefix("s3://").partition("/")
    key = f"{prefix}/{version.vllm_name}"
    client.put_object(
        Bucket=bucket,
        Key=f"{key}/adapter_model.safetensors",
        Body=(weights_from / "adapter_model.safetensors").read_bytes(),
    )
    if forge:  # a consistent forgery: the manifest matches the swapped files
        manifest = json.loads(client.get_object(Bucket=bucket, Key=f"{key}/{MANIFEST}")["Body"].read())
        manifest["files"]["adapter_model.safetensors"] = manifest_of(weights_from)["adapter_model.safetensors"]
        client.put_object(Bucket=bucket, Key=f"{key}/{MANIFEST}", Body=json.dumps(manifest).encode())


def test_a_version_swapped_in_the_bucket_after_registration_is_refused_with_a_digest_mismatch(
    replica, object_store, tenant, adapter, make_lora_adapter
):
    other = make_lora_adapter(seed=42)
    for seed, forge in ((41, True), (43, False)):
        version = adapter_version_register(
            tenant, adapter=adapter, source_dir=make_lora_adapter(seed=seed), enqueue_load=False
        )
        _tamper(object_store, replica, version, other, forge=forge)

        assert adapter_version_load(version_id=version.pk) == "failed"
        version.refresh_from_db()
        assert version.status == AdapterVersion.Status.FAILED
        assert "digest mismatch" in version.status_message, version.status_message
        assert version.vllm_name not in replica.cached()
        assert version.vllm_name not in {m.id for m in vllm_client().models()}
