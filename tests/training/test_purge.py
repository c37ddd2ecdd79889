"""Erase reaches every copy: the weights of versions that learned from an erased end user are purged
once replaced (every object version in a versioned bucket, or the folder), audited, and the erase
report says what remains and until when."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_version_mark_loaded, adapter_version_promote, adapter_version_register
from apps.interactions.models import Interaction
from apps.privacy.services import end_user_erase
from apps.tenants.models import AuditEvent
from apps.training.models import TrainingRun, TrainingRunEvent

pytestmark = pytest.mark.django_db


def trained_on(tenant, adapter, version, *, users: set[str]) -> TrainingRun:
    """A finished run that produced ``version`` from the events of ``users``."""
    run = TrainingRun.objects.create(
        tenant=tenant, adapter=adapter, status="candidate", output_version=version, parent_version=version.parent
    )
    for interaction in Interaction.objects.filter(tenant=tenant, end_user_id__in=users).prefetch_related("feedback"):
        for feedback in interaction.feedback.all():
            TrainingRunEvent.objects.create(run=run, feedback=feedback, held_out=False, reward=0.0)
    return run


@pytest.fixture
def lineage(tenant, tiny_adapter, add_events, make_lora_adapter):
    """v1 learned from dev-1..dev-4, v2 (from v1) from dev-0, v3 (from v1) from dev-1..dev-4 again;
    v3 serves in production."""
    add_events(10)
    versions = []
    for seed, parent in ((21, None), (22, 0), (23, 0)):
        version = adapter_version_register(
            tenant,
            adapter=tiny_adapter,
            source_dir=make_lora_adapter(seed),
            parent=versions[parent] if parent is not None else None,
            enqueue_load=False,
        )
        versions.append(adapter_version_mark_loaded(version))
    v1, v2, v3 = versions
    trained_on(tenant, tiny_adapter, v1, users={"dev-1", "dev-2", "dev-3", "dev-4"})
    trained_on(tenant, tiny_adapter, v2, users={"dev-0"})
    trained_on(tenant, tiny_adapter, v3, users={"dev-1", "dev-2", "dev-3", "dev-4"})
    adapter_version_promote(tenant, version=v3, actor="test")
    return v1, v2, v3


def test_a_version_is_purgeable_only_once_it_learned_from_an_erased_user(client_a, lineage):
    v1, v2, _ = lineage
    refused = client_a.post(f"/v1/adapters/tab/versions/{v2.number}/purge")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_trained_on_erased_user"
    assert Path(v2.artifact_path).is_dir()
    assert client_a.delete("/v1/users/dev-0").status_code == 200
    assert client_a.post(f"/v1/adapters/tab/versions/{v1.number}/purge").status_code == 409  # v1 is clean


def test_the_local_store_folder_is_removed_audited_and_the_version_can_never_serve_again(client_a, tenant, lineage):
    v1, v2, _ = lineage
    end_user_erase(tenant, external_id="dev-0", actor="test")

    response = client_a.post(f"/v1/adapters/tab/versions/{v2.number}/purge")

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "purged" and response.json()["purged_at"]
    assert not Path(v2.artifact_path).exists()
    assert Path(v1.artifact_path).is_dir()  # the clean parent keeps its weights
    [audit] = AuditEvent.objects.filter(tenant=tenant, action="adapter_version.purge")
    assert audit.target_id == v2.vllm_name and audit.data["objects_deleted"] >= 2
    again = client_a.post(f"/v1/adapters/tab/versions/{v2.number}/purge")  # idempotent, no second row
    assert again.status_code == 200 and AuditEvent.objects.filter(action="adapter_version.purge").count() == 1
    promote = client_a.post(f"/v1/adapters/tab/versions/{v2.number}/promote")
    assert promote.status_code == 409 and promote.json()["error"]["code"] == "version_purged"
    rollback = client_a.post("/v1/adapters/tab/rollback", {"version": v2.number}, format="json")
    assert rollback.status_code == 409


def test_production_and_versions_descending_from_a_marked_one_wait_until_replaced(
    client_a, tenant, tiny_adapter, lineage, make_lora_adapter
):
    _, v2, v3 = lineage
    v4 = adapter_version_register(
        tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(24), parent=v2, enqueue_load=False
    )
    v4 = adapter_version_mark_loaded(v4)
    trained_on(tenant, tiny_adapter, v4, users={"dev-1"})
    adapter_version_promote(tenant, version=v4, actor="test")  # v4 inherits what v2 learned from dev-0
    report = client_a.delete("/v1/users/dev-0").json()

    weights = {r["version"]: r for r in report["remains"] if r["kind"] == "weights"}
    assert set(weights) == {v2.number, v4.number}
    assert weights[v2.number]["state"] == "purgeable" and "/purge" in weights[v2.number]["until"]
    assert weights[v4.number]["state"] == "in_use" and "production" in weights[v4.number]["until"]
    assert {r["kind"] for r in report["remains"]} >= {"backups", "vllm_replica_caches"}

    refused = client_a.post(f"/v1/adapters/tab/versions/{v4.number}/purge")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "version_in_use"
    assert Path(v4.artifact_path).is_dir()
    adapter_version_promote(tenant, version=v3, actor="test")  # replaced
    assert client_a.post(f"/v1/adapters/tab/versions/{v4.number}/purge").status_code == 200


def test_the_command_purges_every_replaced_marked_version_and_names_what_it_refuses(tenant, lineage):
    v1, v2, v3 = lineage
    end_user_erase(tenant, external_id="dev-1", actor="test")  # v1 and v3 learned from dev-1; v2 descends from v1
    with pytest.raises(CommandError, match="production"):
        call_command("adapter_version_purge", tenant.slug, "tab", str(v3.number), stdout=StringIO())
    out = StringIO()
    call_command("adapter_version_purge", tenant.slug, "tab", stdout=out)
    assert "2 version(s) purged" in out.getvalue()
    statuses = dict(AdapterVersion.objects.filter(adapter=v1.adapter).values_list("number", "status"))
    assert statuses == {v1.number: "purged", v2.number: "purged", v3.number: "production"}


def test_another_tenants_version_is_a_404_and_keeps_its_weights(make_tenant, make_client, tenant, lineage):
    _, v2, _ = lineage
    end_user_erase(tenant, external_id="dev-0", actor="test")
    other = make_client(make_tenant("other"))
    assert other.post(f"/v1/adapters/tab/versions/{v2.number}/purge").status_code == 404
    assert Path(v2.artifact_path).is_dir()


def test_every_object_version_of_an_s3_version_is_deleted_from_a_versioned_bucket(
    s3_store, object_store, tenant, tiny_adapter, add_events, make_lora_adapter, client_a
):
    bucket = s3_store.removeprefix("s3://").split("/")[0]
    s3 = object_store.client()
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    add_events(5)
    version = adapter_version_register(
        tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(25), enqueue_load=False
    )
    trained_on(tenant, tiny_adapter, version, users={"dev-0"})
    prefix = f"adapters/{version.vllm_name}/"
    # An older copy of a file and a plain delete's marker: a delete without version ids leaves both.
    s3.put_object(Bucket=bucket, Key=f"{prefix}adapter_config.json", Body=b"{}")
    s3.delete_object(Bucket=bucket, Key=f"{prefix}adapter_config.json")
    before = s3.list_object_versions(Bucket=bucket, Prefix=prefix)
    assert len(before["Versions"]) >= 3 and before["DeleteMarkers"]
    neighbour = adapter_version_register(
        tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(26), enqueue_load=False
    )
    end_user_erase(tenant, external_id="dev-0", actor="test")

    response = client_a.post(f"/v1/adapters/tab/versions/{version.number}/purge")

    assert response.status_code == 200, response.content
    after = s3.list_object_versions(Bucket=bucket, Prefix=prefix)
    assert not after.get("Versions") and not after.get("DeleteMarkers")
    kept = s3.list_object_versions(Bucket=bucket, Prefix=f"adapters/{neighbour.vllm_name}/")
    assert kept.get("Versions")  # only the purged version's objects went
    [audit] = AuditEvent.objects.filter(tenant=tenant, action="adapter_version.purge")
    assert audit.data["objects_deleted"] == len(before["Versions"]) + len(before["DeleteMarkers"])


def test_an_s3_purge_deletes_with_the_purge_key_where_one_is_set(
    s3_store, settings, tenant, tiny_adapter, add_events, make_lora_adapter, client_a
):
    """The keys that read and write the store never delete: the purge has a key of its own."""
    from apps.adapters.store import store_for

    settings.STROP_STORE_PURGE_KEY_ID = "strop-store-purger"
    settings.STROP_STORE_PURGE_SECRET = "a-purge-secret-of-its-own-Zq81"
    add_events(5)
    version = adapter_version_register(
        tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(27), enqueue_load=False
    )
    trained_on(tenant, tiny_adapter, version, users={"dev-0"})
    end_user_erase(tenant, external_id="dev-0", actor="test")
    store = store_for(version.artifact_path)

    response = client_a.post(f"/v1/adapters/tab/versions/{version.number}/purge")

    assert response.status_code == 200, response.content
    assert store.purge_client.meta.region_name == store.client.meta.region_name
    assert store.purge_client._request_signer._credentials.access_key == "strop-store-purger"
    assert store.client._request_signer._credentials.access_key != "strop-store-purger"
    assert not store.client.list_objects_v2(Bucket=store.bucket, Prefix=f"{store.prefix}/{version.vllm_name}/").get(
        "Contents"
    )
