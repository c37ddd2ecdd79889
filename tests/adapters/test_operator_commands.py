"""The operator's adapter commands refuse what would break the platform later, saying what is wrong
and writing nothing: a name the dashboard's URLs cannot hold, a folder that is no adapter of the
base, other weights under a base model its versions were trained on, and options that select
nothing."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.adapters.services import adapter_create, adapter_version_register
from apps.common.exceptions import ValidationFailed
from apps.tenants.models import AuditEvent
from model_supply.base_models import BASE_RECORD

pytestmark = pytest.mark.django_db


def _command(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _version(tenant, adapter, source: Path) -> AdapterVersion:
    return adapter_version_register(tenant, adapter=adapter, source_dir=source, enqueue_load=False)


# An adapter's name ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tab.v2", "tab v2", "tåb", "a/b", "", "x" * 65])
def test_adapter_create_refuses_a_name_the_dashboards_urls_cannot_hold(tenant, tiny_base, name):
    with pytest.raises(CommandError, match=r"^name: .*letters, digits, hyphens and underscores") as refused:
        _command("adapter_create", tenant.slug, name, "--base", tiny_base.name)
    assert "64" in str(refused.value)
    assert not Adapter.objects.exists()
    assert not AuditEvent.objects.filter(action="adapter.create").exists()


def test_the_service_refuses_a_bad_name_for_every_caller_naming_the_field(tenant, tiny_base):
    with pytest.raises(ValidationFailed) as refused:
        adapter_create(tenant, name="tab.v2", base_model=tiny_base)
    assert refused.value.param == "name" and refused.value.code == "invalid"
    assert not Adapter.objects.exists()


def test_every_name_adapter_create_takes_makes_the_dashboards_urls(tenant, tiny_base):
    for name in ("tab", "Tab_2-x", "y" * 64):
        _command("adapter_create", tenant.slug, name, "--base", tiny_base.name)
    for adapter in Adapter.objects.filter(tenant=tenant):
        assert reverse("dashboard:adapter-overview", kwargs={"tenant_slug": tenant.slug, "adapter_name": adapter.name})


# adapter_version_register: the folder is checked before the probe loads it ------------------------


def test_registering_a_folder_that_does_not_exist_says_so(tenant, adapter, tmp_path):
    with pytest.raises(CommandError, match="no such directory"):
        _command("adapter_version_register", tenant.slug, adapter.name, str(tmp_path / "nonexistent"))
    assert not AdapterVersion.objects.exists()


def test_registering_an_empty_folder_says_what_an_adapter_holds(tenant, adapter, tmp_path):
    with pytest.raises(CommandError, match="needs adapter_config.json and adapter_model.safetensors"):
        _command("adapter_version_register", tenant.slug, adapter.name, str(tmp_path))
    assert not AdapterVersion.objects.exists()


@pytest.fixture(scope="module")
def other_base_lora(tmp_path_factory) -> Path:
    """A LoRA adapter trained on the small starter model, not on the tiny one the tests' adapter uses."""
    from model_supply.starter import ensure_starter_model
    from tests.fixtures.vllm import write_random_lora

    return write_random_lora(ensure_starter_model("small"), tmp_path_factory.mktemp("other") / "lora", seed=1)


def test_registering_an_adapter_trained_on_another_base_says_so(tenant, adapter, other_base_lora):
    with pytest.raises(CommandError, match=f"does not fit base model '{adapter.base_model.name}'"):
        _command("adapter_version_register", tenant.slug, adapter.name, str(other_base_lora))
    assert not AdapterVersion.objects.exists()


def test_registering_an_adapter_of_another_base_that_names_no_base_here_says_it_does_not_load(
    tenant, adapter, other_base_lora, tmp_path
):
    anonymous = shutil.copytree(other_base_lora, tmp_path / "lora")
    config = json.loads((anonymous / "adapter_config.json").read_text())
    (anonymous / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "org/model"}))
    with pytest.raises(CommandError, match=f"does not load on base model '{adapter.base_model.name}'.*size mismatch"):
        _command("adapter_version_register", tenant.slug, adapter.name, str(anonymous))
    assert not AdapterVersion.objects.exists()


# base_model_register: other weights under a name its versions were trained on ----------------------


def _other_weights(model_dir: Path, to: Path) -> Path:
    """A model directory whose fingerprint differs from ``model_dir``'s (its config changed)."""
    shutil.copytree(model_dir, to)
    (to / BASE_RECORD).unlink(missing_ok=True)
    config = json.loads((to / "config.json").read_text())
    (to / "config.json").write_text(json.dumps({**config, "rope_theta": config.get("rope_theta", 10000.0) * 2}))
    return to


def test_registering_the_same_model_again_changes_nothing_and_succeeds(tenant, adapter, make_lora_adapter):
    _version(tenant, adapter, make_lora_adapter(seed=1))
    base = BaseModel.objects.get()
    out = _command("base_model_register", base.name, base.path)
    assert f"fingerprint: {base.fingerprint}" in out
    assert BaseModel.objects.get() == base and BaseModel.objects.get().fingerprint == base.fingerprint


def test_other_weights_under_a_base_its_versions_were_trained_on_are_refused_unless_forced(
    tenant, adapter, make_lora_adapter, tmp_path
):
    _version(tenant, adapter, make_lora_adapter(seed=2))
    before = BaseModel.objects.get()
    other = _other_weights(Path(before.path), tmp_path / "other")

    with pytest.raises(CommandError, match=r"^path: .*1 adapter version\(s\) were trained on it.*--force"):
        _command("base_model_register", before.name, str(other))
    after = BaseModel.objects.get()
    assert (after.path, after.fingerprint) == (before.path, before.fingerprint)

    _command("base_model_register", before.name, str(other), "--force")
    forced = BaseModel.objects.get()
    assert forced.path == str(other.resolve()) and forced.fingerprint != before.fingerprint


def test_a_base_without_trained_versions_may_point_at_other_weights(tenant, adapter, tmp_path):
    before = BaseModel.objects.get()
    other = _other_weights(Path(before.path), tmp_path / "other")
    _command("base_model_register", before.name, str(other))
    assert BaseModel.objects.get().fingerprint != before.fingerprint


# adapter_version_reprobe: options that select nothing are errors -------------------------------------


def test_reprobe_refuses_an_adapter_without_its_tenant(tenant, adapter):
    with pytest.raises(CommandError, match="--adapter .*give --tenant too"):
        _command("adapter_version_reprobe", "--adapter", adapter.name)


def test_reprobe_refuses_version_number_zero(tenant, adapter):
    with pytest.raises(CommandError, match="--number 0: version numbers start at 1"):
        _command("adapter_version_reprobe", "--tenant", tenant.slug, "--adapter", adapter.name, "--number", "0")


def test_reprobe_refuses_an_adapter_the_tenant_does_not_have(tenant, adapter):
    with pytest.raises(CommandError, match="'nope' not found"):
        _command("adapter_version_reprobe", "--tenant", tenant.slug, "--adapter", "nope")


def test_reprobe_refuses_a_version_number_the_adapter_does_not_have(tenant, adapter):
    with pytest.raises(CommandError, match="has no version 7"):
        _command("adapter_version_reprobe", "--tenant", tenant.slug, "--adapter", adapter.name, "--number", "7")
