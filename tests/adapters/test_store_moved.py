"""A store that moved (STROP_ADAPTER_STORE to another prefix of the same bucket, STROP_ADAPTER_ROOT to
another folder) still reads, fetches and purges the versions written before the move from where they
lie, and a vLLM replica configured with the new prefix still loads them
(platform/vllm_plugins/strop_vllm_store.py), but never under another version's name. The S3 tests
talk to moto's server mode (tests/fixtures/object_store.py), standing in for S3.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_version_fetch, adapter_version_register
from apps.adapters.store import LocalStore, S3Store, adapter_store, manifest_of, store_for

pytestmark = pytest.mark.django_db

PLUGIN = Path(__file__).resolve().parents[2] / "platform" / "vllm_plugins" / "strop_vllm_store.py"


def register(tenant, adapter, source) -> AdapterVersion:
    return adapter_version_register(tenant, adapter=adapter, source_dir=source, enqueue_load=False)


def test_after_the_store_moves_to_another_prefix_an_older_version_is_fetched_and_purged_where_it_lies(
    settings, s3_store, object_store, tenant, adapter, make_lora_adapter, tmp_path
):
    source = make_lora_adapter(seed=61)
    old = register(tenant, adapter, source)
    kept = register(tenant, adapter, make_lora_adapter(seed=62))
    settings.STROP_ADAPTER_STORE = f"{s3_store}-v2"  # s3://<same bucket>/adapters-v2
    new_source = make_lora_adapter(seed=63)
    new = register(tenant, adapter, new_source)
    assert new.artifact_path.startswith(f"{s3_store}-v2/") and old.artifact_path.startswith(f"{s3_store}/")

    assert manifest_of(adapter_version_fetch(old, into=tmp_path / "parent")) == manifest_of(source)
    assert store_for(old.artifact_path).purge(old.artifact_path) > 0
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    listed = object_store.client().list_object_versions(Bucket=bucket, Prefix="adapters/")
    left = {item["Key"].split("/")[1] for item in [*listed.get("Versions", []), *listed.get("DeleteMarkers", [])]}
    assert left == {kept.vllm_name}  # only the purged version's objects went, and the new prefix is untouched
    assert manifest_of(adapter_version_fetch(new, into=tmp_path / "new")) == manifest_of(new_source)
    store = store_for(old.artifact_path)
    assert isinstance(store, S3Store) and (store.bucket, store.prefix) == (bucket, "adapters")
    assert store_for(new.artifact_path) is adapter_store()  # the configured store, its clients reused


def test_after_the_adapter_folder_moves_an_older_version_is_fetched_and_purged_where_it_lies(
    settings, tenant, adapter, make_lora_adapter, tmp_path
):
    settings.STROP_ADAPTER_ROOT = tmp_path / "before"
    old = register(tenant, adapter, make_lora_adapter(seed=64))
    kept = register(tenant, adapter, make_lora_adapter(seed=65))
    settings.STROP_ADAPTER_ROOT = tmp_path / "after"
    new = register(tenant, adapter, make_lora_adapter(seed=66))
    assert Path(new.artifact_path).is_relative_to(tmp_path / "after")

    assert adapter_version_fetch(old, into=tmp_path / "unused") == Path(old.artifact_path)
    assert store_for(old.artifact_path).purge(old.artifact_path) >= 2
    assert not Path(old.artifact_path).exists()
    assert Path(kept.artifact_path).is_dir() and Path(new.artifact_path).is_dir()
    store = store_for(old.artifact_path)
    assert isinstance(store, LocalStore) and store.root == tmp_path / "before"
    assert store_for(new.artifact_path) is adapter_store()


def load_plugin(monkeypatch) -> ModuleType:
    """The replica's plugin module (it imports nothing of Strop's), fresh, reading this environment."""
    spec = importlib.util.spec_from_file_location("strop_vllm_store_under_test", PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def plugin(monkeypatch) -> ModuleType:
    """The plugin configured with a store that moved to a new prefix of its bucket."""
    monkeypatch.setenv("STROP_ADAPTER_STORE", "s3://strop-adapters/adapters-v2")
    return load_plugin(monkeypatch)


NAME = "acme--tab--v3-0a1b2c3d"


@pytest.mark.parametrize(
    ("address", "prefix"),
    [
        (f"s3://strop-adapters/adapters-v2/{NAME}", "adapters-v2"),  # the configured prefix
        (f"s3://strop-adapters/adapters/{NAME}", "adapters"),  # an earlier prefix of the same bucket
        (f"s3://strop-adapters/teams/one/adapters/{NAME}", "teams/one/adapters"),
        (f"s3://strop-adapters/{NAME}", ""),
        ("s3://strop-adapters/adapters/other--tab--v3-0a1b2c3d", None),  # another tenant's version
        (f"s3://strop-adapters/adapters/{NAME}/x", None),
        (f"s3://strop-adapters/adapters/{NAME}/", None),
        (f"s3://other-bucket/adapters-v2/{NAME}", None),  # another bucket: never this replica's keys
        (f"s3://strop-adapters/adapters/../adapters-v2/{NAME}", None),
        (f"s3://strop-adapters/./{NAME}", None),
        (f"s3://strop-adapters//{NAME}", None),
        (f"/var/adapters/acme/tab/{NAME}", None),
    ],
)
def test_a_replica_takes_a_versions_address_under_any_prefix_of_its_bucket_but_only_under_its_own_name(
    plugin, address, prefix
):
    assert plugin.Store(plugin.store_url()).prefix_of(NAME, address) == prefix


def test_a_replica_refuses_a_name_it_would_never_fetch_whatever_the_address(plugin):
    store = plugin.Store(plugin.store_url())
    for name in ("_acme--tab--v1-0a1b2c3d", "..", f"{NAME}/x", ""):
        assert store.prefix_of(name, f"s3://strop-adapters/adapters/{name}") is None


def test_a_replica_loads_a_version_written_under_the_buckets_earlier_prefix(
    settings, s3_store, object_store, monkeypatch, tenant, adapter, make_lora_adapter, tmp_path
):
    """The replica's load middleware, in this process: what it hands vLLM for Strop's load of a
    version written before the store moved to the replica's prefix."""
    source = make_lora_adapter(seed=67)
    old = register(tenant, adapter, source)  # under s3://<bucket>/adapters
    for name, value in object_store.env(f"{s3_store}-v2").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("STROP_VLLM_ADAPTER_CACHE", str(tmp_path / "cache"))
    plugin = load_plugin(monkeypatch)
    handed: list[dict[str, object]] = []

    async def vllm(scope, receive, send) -> None:
        handed.append(json.loads((await receive())["body"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"Success"})

    def load(name: str, path: str) -> int:
        body = json.dumps({"lora_name": name, "lora_path": path, "strop_digest": old.digest}).encode()
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/load_lora_adapter", "headers": []}
        asyncio.run(plugin.FetchOnLoad(vllm)(scope, receive, send))
        return int(str(sent[0]["status"]))

    assert load(old.vllm_name, old.artifact_path) == 200
    assert handed[-1]["lora_path"] == str(tmp_path / "cache" / old.vllm_name)
    assert manifest_of(tmp_path / "cache" / old.vllm_name) == manifest_of(source)

    other = f"{s3_store}/{old.vllm_name.replace('acme--', 'other--')}"  # another tenant's name, same prefix
    assert load(old.vllm_name.replace("acme--", "other--", 1), old.artifact_path) == 400
    assert load(old.vllm_name, other) == 400
    assert len(handed) == 1
