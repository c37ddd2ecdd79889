"""Versions made before the synthetic serve probe kept token ids cut from a training sample; the
migration ``adapters.0006`` removes them (and only them)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db(transaction=True)  # migrations run outside the test's transaction

BEFORE = [("adapters", "0005_version_store_digest_steps")]
SCRUB = [("adapters", "0006_scrub_user_derived_serve_probes")]


def test_the_migration_scrubs_a_probe_cut_from_a_users_sample_and_keeps_a_synthetic_one(make_tenant, migrate_to):
    tenant = make_tenant("old-probes")
    old_apps = migrate_to(BEFORE)
    base = old_apps.get_model("adapters", "BaseModel").objects.create(name="old-base", path="/m", family="qwen")
    adapter = old_apps.get_model("adapters", "Adapter").objects.create(
        tenant_id=tenant.pk, name="tab", base_model=base
    )
    version_model = old_apps.get_model("adapters", "AdapterVersion")
    user_derived = {"prompt_token_ids": [4711, 815, 99], "completion_token_ids": [1234], "logprobs": [-0.7]}
    synthetic = {"source": "synthetic", "prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": [-1.0]}
    old = version_model.objects.create(
        tenant_id=tenant.pk, adapter=adapter, number=1, artifact_path="/a/1", vllm_name="old-probes--tab--v1",
        status="production", metrics={"trainer": {"steps": 3}, "run": 7, "serve_probe": user_derived},
    )
    new = version_model.objects.create(
        tenant_id=tenant.pk, adapter=adapter, number=2, artifact_path="/a/2", vllm_name="old-probes--tab--v2",
        status="candidate", metrics={"serve_probe": synthetic},
    )
    new_apps = migrate_to(SCRUB)
    rows = new_apps.get_model("adapters", "AdapterVersion").objects
    assert rows.get(pk=old.pk).metrics == {"trainer": {"steps": 3}, "run": 7, "serve_probe_scrubbed": True}
    assert rows.get(pk=new.pk).metrics == {"serve_probe": synthetic}


def test_a_version_whose_probe_was_scrubbed_is_refused_an_experiment_with_how_to_probe_it_again(
    tenant, adapter, make_lora_adapter
):
    from apps.adapters.loading import serve_probe_verify
    from apps.adapters.services import adapter_version_register
    from apps.common.exceptions import Conflict

    version = adapter_version_register(
        tenant, adapter=adapter, source_dir=make_lora_adapter(1), enqueue_load=False,
        metrics={"serve_probe_scrubbed": True},
    )
    with pytest.raises(Conflict) as refused:
        serve_probe_verify(version)
    assert refused.value.code == "no_serve_probe" and "adapter_version_reprobe" in refused.value.message


def test_reprobe_records_the_synthetic_probe_on_a_scrubbed_version_and_audits_it(
    tenant, adapter, make_lora_adapter
):
    from io import StringIO

    from django.core.management import call_command

    from apps.adapters.services import adapter_version_register
    from apps.tenants.models import AuditEvent

    version = adapter_version_register(
        tenant, adapter=adapter, source_dir=make_lora_adapter(2), enqueue_load=False,
        metrics={"run": 3, "serve_probe_scrubbed": True},
    )
    out = StringIO()
    call_command("adapter_version_reprobe", tenant=tenant.slug, stdout=out)
    version.refresh_from_db()
    probe = version.metrics["serve_probe"]
    assert probe["source"] == "synthetic" and len(probe["logprobs"]) == len(probe["completion_token_ids"])
    assert "serve_probe_scrubbed" not in version.metrics and version.metrics["run"] == 3
    assert AuditEvent.objects.filter(tenant=tenant, action="adapter_version.reprobe").count() == 1
    assert "1 version(s) probed" in out.getvalue()
