"""The adapter store: versions written once with a digest, read back only if they check out.

The S3 tests talk to moto's server mode (tests/fixtures/object_store.py), the stand-in for an
S3-compatible service, which nothing on this machine or in CI provides.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from apps.adapters.loading import adapter_version_load
from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_version_fetch, adapter_version_register
from apps.adapters.store import (
    MANIFEST,
    S3Store,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    adapter_store,
    manifest_digest,
    manifest_of,
    store_for,
)
from apps.common.exceptions import ServiceUnavailable

pytestmark = pytest.mark.django_db


def register(tenant, adapter, source, **kwargs) -> AdapterVersion:
    return adapter_version_register(tenant, adapter=adapter, source_dir=source, enqueue_load=False, **kwargs)


def with_steps(source: Path, rows: int = 3) -> Path:
    with (source / "metrics.jsonl").open("w") as fh:
        for step in range(rows):
            fh.write(json.dumps({"step": step, "loss": 1.0 / (step + 1)}) + "\n")
        fh.write("not json\n")
    return source


def test_a_local_version_carries_its_digest_and_a_changed_file_is_refused(tenant, adapter, make_lora_adapter):
    source = make_lora_adapter(seed=11)
    version = register(tenant, adapter, source)
    folder = Path(version.artifact_path)
    assert (folder / MANIFEST).is_file()
    assert version.digest == manifest_digest(manifest_of(source)) and version.digest.startswith("sha256:")
    assert adapter_version_fetch(version, into=Path("/nonexistent")) == folder  # read in place on one box

    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ServiceUnavailable, match="files differ from the manifest"):
        adapter_version_fetch(version, into=Path("/nonexistent"))


def test_loading_a_local_version_whose_files_changed_is_refused_before_vllm_is_asked(
    settings, tenant, adapter, make_lora_adapter, tmp_path
):
    settings.STROP_ADAPTER_ROOT = tmp_path / "adapters"
    settings.VLLM_BASE_URLS = ["http://127.0.0.1:9"]  # nothing listens: a call to vLLM would raise
    version = register(tenant, adapter, make_lora_adapter(seed=12))
    folder = Path(version.artifact_path)
    other = make_lora_adapter(seed=13)  # a consistent swap: the weights and the manifest both replaced
    (folder / "adapter_model.safetensors").write_bytes((other / "adapter_model.safetensors").read_bytes())
    (folder / MANIFEST).write_text(json.dumps({"files": manifest_of(folder)}))

    assert adapter_version_load(version_id=version.pk) == "failed"
    version.refresh_from_db()
    assert version.status == AdapterVersion.Status.FAILED
    assert version.status_message.startswith("digest mismatch:"), version.status_message


def test_the_trainers_step_metrics_are_kept_in_the_row(tenant, adapter, make_lora_adapter, tmp_path):
    source = tmp_path / "with-steps"
    source.mkdir()
    for path in make_lora_adapter(seed=12).iterdir():
        (source / path.name).write_bytes(path.read_bytes())
    version = register(tenant, adapter, with_steps(source))
    assert [row["step"] for row in version.training_steps] == [0, 1, 2]  # the unreadable line is skipped


def test_an_s3_version_lives_in_the_bucket_only_and_is_fetched_intact(
    settings, s3_store, object_store, tenant, adapter, make_lora_adapter, tmp_path
):
    source = make_lora_adapter(seed=13)
    version = register(tenant, adapter, source)
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    assert version.artifact_path == f"{s3_store}/{version.vllm_name}"
    keys = {o["Key"] for o in object_store.client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {f"adapters/{version.vllm_name}/{name}" for name in (*manifest_of(source), MANIFEST)}
    assert not any(Path(settings.STROP_ADAPTER_ROOT).rglob("*"))  # nothing written to a local disk
    assert version.digest == manifest_digest(manifest_of(source))

    fetched = adapter_version_fetch(version, into=tmp_path / "parent")
    assert manifest_of(fetched) == manifest_of(source)
    assert adapter_version_fetch(version, into=tmp_path / "parent") == fetched  # a checked copy is reused

    with pytest.raises(StoreError, match="written once"):
        adapter_store().put(source, tenant="acme", adapter="autocomplete", slug="x", vllm_name=version.vllm_name)


def test_a_tampered_or_incomplete_s3_version_is_never_used(
    s3_store, object_store, tenant, adapter, make_lora_adapter, tmp_path
):
    version = register(tenant, adapter, make_lora_adapter(seed=14))
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    client = object_store.client()
    client.put_object(Bucket=bucket, Key=f"adapters/{version.vllm_name}/adapter_config.json", Body=b"{}")
    with pytest.raises(ServiceUnavailable, match="do not match|differ"):
        adapter_version_fetch(version, into=tmp_path / "a")
    assert not (tmp_path / "a").exists()  # no half-checked folder is left for the trainer

    client.delete_object(Bucket=bucket, Key=f"adapters/{version.vllm_name}/{MANIFEST}")
    with pytest.raises(ServiceUnavailable, match="could not be read"):
        adapter_version_fetch(version, into=tmp_path / "b")


def test_the_store_check_names_what_is_wrong(settings, object_store):
    missing = S3Store("s3://strop-no-such-bucket/x")
    settings.AWS_ENDPOINT_URL = object_store.endpoint
    settings.AWS_ACCESS_KEY_ID, settings.AWS_SECRET_ACCESS_KEY = "k", "s"
    with pytest.raises(StoreUnavailable, match="bucket .strop-no-such-bucket. does not exist"):
        missing.check()
    settings.AWS_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens on the discard port
    with pytest.raises(StoreUnavailable, match="cannot be reached"):
        S3Store("s3://strop-any/x").check()


def test_a_corrupt_manifest_digest_is_refused(s3_store, tenant, adapter, make_lora_adapter, tmp_path):
    version = register(tenant, adapter, make_lora_adapter(seed=15))
    version.digest = "sha256:" + "0" * 64
    with pytest.raises(ServiceUnavailable, match="digest"):
        adapter_version_fetch(version, into=tmp_path / "c")
    with pytest.raises(StoreCorrupt):
        adapter_store().fetch(version.artifact_path, digest=version.digest, dest=tmp_path / "d")


def test_an_unreachable_object_store_refuses_a_new_version_as_unavailable_and_keeps_no_row(
    settings, tenant, adapter, make_lora_adapter
):
    settings.STROP_ADAPTER_STORE = "s3://strop-any/adapters"
    settings.AWS_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens on the discard port
    settings.AWS_ACCESS_KEY_ID, settings.AWS_SECRET_ACCESS_KEY = "k", "s"
    with pytest.raises(ServiceUnavailable, match="cannot be reached"):
        register(tenant, adapter, make_lora_adapter(seed=16))
    assert not AdapterVersion.objects.exists()


@dataclass
class CutOff:
    """An S3 endpoint in front of the test store whose connection breaks off halfway through the
    bodies of the objects ``cut`` names, as a network dropping mid-download does."""

    endpoint: str
    cut: str = ""


@pytest.fixture
def cut_off(object_store) -> Iterator[CutOff]:
    upstream = object_store.client()
    state = CutOff(endpoint="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            bucket, _, key = unquote(urlsplit(self.path).path).lstrip("/").partition("/")
            body = upstream.get_object(Bucket=bucket, Key=key)["Body"].read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2] if state.cut and key.endswith(state.cut) else body)
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("cut", [MANIFEST, "adapter_model.safetensors"])
def test_a_download_broken_off_midway_is_the_store_unavailable_and_leaves_no_folder(
    settings, s3_store, cut_off, tenant, adapter, make_lora_adapter, tmp_path, cut
):
    version = register(tenant, adapter, make_lora_adapter(seed=17))
    settings.AWS_ENDPOINT_URL = cut_off.endpoint
    assert manifest_of(adapter_version_fetch(version, into=tmp_path / "whole"))  # the endpoint itself works
    cut_off.cut = cut
    with pytest.raises(ServiceUnavailable, match="cannot be reached"):
        adapter_version_fetch(version, into=tmp_path / "cut")
    assert not (tmp_path / "cut").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["whole"]  # no staging folder left behind


def test_a_manifest_of_the_wrong_shape_is_refused_as_corrupt_in_the_store_and_on_disk(
    settings, s3_store, object_store, tenant, adapter, make_lora_adapter, tmp_path
):
    source = make_lora_adapter(seed=18)
    listed = json.dumps({"files": sorted(manifest_of(source))}).encode()  # names without their hashes
    version = register(tenant, adapter, source)
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    object_store.client().put_object(Bucket=bucket, Key=f"adapters/{version.vllm_name}/{MANIFEST}", Body=listed)
    with pytest.raises(ServiceUnavailable, match="does not map file names"):
        adapter_version_fetch(version, into=tmp_path / "s3")
    assert not (tmp_path / "s3").exists()

    settings.STROP_ADAPTER_STORE = ""
    local = register(tenant, adapter, make_lora_adapter(seed=19))
    (Path(local.artifact_path) / MANIFEST).write_bytes(listed)
    with pytest.raises(ServiceUnavailable, match="does not map file names"):
        adapter_version_fetch(local, into=tmp_path / "unused")


def test_a_manifest_is_checked_against_the_versions_digest_before_any_file_is_downloaded(
    s3_store, object_store, tenant, adapter, make_lora_adapter, tmp_path
):
    version = register(tenant, adapter, make_lora_adapter(seed=20))
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    # The weights are gone: a fetch that downloaded before checking would fail on them instead.
    object_store.client().delete_object(Bucket=bucket, Key=f"adapters/{version.vllm_name}/adapter_model.safetensors")
    with pytest.raises(StoreCorrupt, match="manifest's digest is not the one recorded"):
        adapter_store().fetch(version.artifact_path, digest="sha256:" + "0" * 64, dest=tmp_path / "e")
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_purge_whose_adapter_folder_is_missing_or_empty_fails_and_deletes_nothing(
    settings, tenant, adapter, make_lora_adapter, tmp_path
):
    settings.STROP_ADAPTER_ROOT = root = tmp_path / "adapters"
    version = register(tenant, adapter, make_lora_adapter(seed=21))
    root.rename(tmp_path / "elsewhere")  # the volume is not mounted on this host
    with pytest.raises(StoreUnavailable, match="is its volume mounted"):
        store_for(version.artifact_path).purge(version.artifact_path)
    root.mkdir()  # an empty mount point, as a readiness check leaves it
    with pytest.raises(StoreUnavailable, match="is its volume mounted"):
        store_for(version.artifact_path).purge(version.artifact_path)
    assert (tmp_path / "elsewhere" / Path(version.artifact_path).relative_to(root) / MANIFEST).is_file()


def test_a_purge_of_a_version_folder_already_gone_from_its_root_deletes_nothing(
    settings, tenant, adapter, make_lora_adapter, tmp_path
):
    settings.STROP_ADAPTER_ROOT = tmp_path / "adapters"
    version = register(tenant, adapter, make_lora_adapter(seed=22))
    store = store_for(version.artifact_path)
    assert store.purge(version.artifact_path) >= 2
    assert store.purge(version.artifact_path) == 0  # idempotent: already gone
