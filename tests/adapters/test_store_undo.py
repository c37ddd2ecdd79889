"""A version's files are uploaded before its row is written: when the transaction then does not
commit, the upload is removed, so the store never keeps a complete version that no row names (and
no erase could reach). The S3 case talks to moto's server mode (tests/fixtures/object_store.py)."""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from pathlib import Path

import pytest
from django.db import DataError, IntegrityError

from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_version_register, atomic_undoing_uploads
from apps.adapters.store import adapter_store, store_for


def register(tenant, adapter, source, **kwargs) -> AdapterVersion:
    return adapter_version_register(tenant, adapter=adapter, source_dir=source, enqueue_load=False, **kwargs)


def stored_files(settings, object_store=None) -> list[str]:
    if settings.STROP_ADAPTER_STORE:
        bucket, _, prefix = settings.STROP_ADAPTER_STORE.removeprefix("s3://").partition("/")
        listed = object_store.client().list_object_versions(Bucket=bucket, Prefix=f"{prefix}/")
        return sorted(item["Key"] for item in [*listed.get("Versions", []), *listed.get("DeleteMarkers", [])])
    return sorted(str(p) for p in Path(settings.STROP_ADAPTER_ROOT).rglob("*") if p.is_file())


@pytest.fixture(params=["local", "s3"])
def either_store(request, settings, tmp_path) -> str:
    settings.STROP_ADAPTER_ROOT = tmp_path / "adapters"
    if request.param == "s3":
        request.getfixturevalue("s3_store")
    return request.param


@pytest.mark.django_db
def test_a_row_that_fails_after_the_upload_takes_the_upload_with_it(
    settings, object_store, either_store, tenant, adapter, make_lora_adapter
):
    with pytest.raises(DataError):  # Postgres keeps no NUL in a JSON column: the insert fails after the upload
        register(tenant, adapter, make_lora_adapter(seed=71), metrics={"note": "\x00"})
    assert not AdapterVersion.objects.exists()
    assert stored_files(settings, object_store) == []

    version = register(tenant, adapter, make_lora_adapter(seed=72))  # the store and the numbering go on
    assert version.number == 1 and stored_files(settings, object_store)


@pytest.mark.django_db
def test_an_outer_transaction_rolled_back_after_the_registration_takes_the_upload_with_it(
    settings, tenant, adapter, make_lora_adapter, tmp_path
):
    settings.STROP_ADAPTER_ROOT = tmp_path / "adapters"
    with pytest.raises(RuntimeError, match="taken back"), atomic_undoing_uploads():
        register(tenant, adapter, make_lora_adapter(seed=73))
        assert stored_files(settings)
        raise RuntimeError("the run was taken back")
    assert not AdapterVersion.objects.exists()
    assert stored_files(settings) == []


@pytest.mark.django_db(transaction=True)
def test_a_commit_that_fails_takes_the_upload_with_it(settings, tenant, adapter, make_lora_adapter, tmp_path):
    settings.STROP_ADAPTER_ROOT = tmp_path / "adapters"
    parent = register(tenant, adapter, make_lora_adapter(seed=74))
    kept = stored_files(settings)
    AdapterVersion.objects.filter(pk=parent.pk).delete()  # gone while a run trained on it
    with pytest.raises(IntegrityError):  # the foreign key to the parent is checked at commit
        register(tenant, adapter, make_lora_adapter(seed=75), parent=parent)
    assert not AdapterVersion.objects.exists()
    assert stored_files(settings) == kept  # only the parent's files, never the new version's


def orphans_listing() -> str:
    """The Python of docs/operate.md's listing of objects without a row, as pasted."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operate.md").read_text()
    start = text.index("To list the objects without a row")
    block = re.search(r"manage\.py shell -c '\n(.*?)\n\s*'\n", text[start:], re.DOTALL)
    assert block, "the listing is in the guide"
    return textwrap.dedent(block.group(1))


@pytest.mark.django_db
def test_the_guides_listing_names_a_version_a_killed_worker_left_without_a_row(
    s3_store, tenant, adapter, make_lora_adapter
):
    registered = register(tenant, adapter, make_lora_adapter(seed=76))
    # What a worker killed between the upload and the commit leaves: the upload, and no row.
    left = adapter_store().put(
        make_lora_adapter(seed=77),
        tenant="acme",
        adapter="autocomplete",
        slug="v2-0a1b2c3d",
        vllm_name="acme--autocomplete--v2-0a1b2c3d",
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(orphans_listing(), {})  # noqa: S102 (the guide's own snippet, as manage.py shell -c runs it)
    assert printed.getvalue() == f"no row: {left.address}\n"
    assert store_for(left.address).purge(left.address) > 0  # the deletion the guide gives
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(orphans_listing(), {})  # noqa: S102
    assert printed.getvalue() == "" and registered.artifact_path.startswith(s3_store)
