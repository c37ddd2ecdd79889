from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.test import override_settings

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.adapters.selectors import adapter_get_for_tenant
from apps.adapters.services import (
    adapter_create,
    adapter_version_mark_loaded,
    adapter_version_promote,
    adapter_version_register,
    base_model_register,
)
from apps.common.exceptions import Conflict, NotFound, ValidationFailed
from apps.tenants.models import AuditEvent
from learning_shared.fingerprint import base_model_fingerprint
from model_supply.base_models import BASE_RECORD, make_base_record, write_base_record
from tests.gpu_trainer.helpers import without_fim_tokens

pytestmark = pytest.mark.django_db


def register(tenant, adapter, source, **kwargs):
    return adapter_version_register(tenant, adapter=adapter, source_dir=source, enqueue_load=False, **kwargs)


def test_base_model_family_is_detected_from_its_tokenizer(tiny_base):
    assert tiny_base.family == "qwen"


def test_base_model_path_must_be_a_model_directory(db, tmp_path):
    with pytest.raises(ValidationFailed, match="config.json"):
        base_model_register(name="nothing", path=tmp_path)
    assert not BaseModel.objects.exists()


def _copy_of(model_dir: Path, to: Path) -> Path:
    shutil.copytree(model_dir, to)
    (to / BASE_RECORD).unlink(missing_ok=True)
    return to


def test_base_model_without_a_record_gets_its_path_as_source_and_a_computed_fingerprint(db, tiny_starter_model,
                                                                                         tmp_path):
    model_dir = _copy_of(tiny_starter_model, tmp_path / "model")
    base = base_model_register(name="copy", path=model_dir)
    assert base.source == f"local directory {model_dir.resolve()}"
    assert base.fingerprint == base_model_fingerprint(model_dir) and len(base.fingerprint) == 16


def test_base_model_source_comes_from_its_strop_base_record(db, tiny_starter_model, tmp_path):
    model_dir = _copy_of(tiny_starter_model, tmp_path / "model")
    write_base_record(model_dir, make_base_record(model_dir, kind="gguf", source="GGUF file /x.gguf (sha256 abc)"))
    base = base_model_register(name="recorded", path=model_dir)
    assert base.source == "GGUF file /x.gguf (sha256 abc)"
    assert base.fingerprint == base_model_fingerprint(model_dir)


def test_a_record_that_no_longer_matches_the_weights_is_refused(db, tiny_starter_model, tmp_path):
    model_dir = _copy_of(tiny_starter_model, tmp_path / "model")
    record = make_base_record(model_dir, kind="hf", source="somewhere")
    write_base_record(model_dir, {**record, "fingerprint": "0" * 16})
    with pytest.raises(ValidationFailed, match="path: .*the directory changed"):
        base_model_register(name="stale", path=model_dir)
    assert not BaseModel.objects.filter(name="stale").exists()


def test_a_model_without_fim_tokens_registers_as_the_plain_family(db, tiny_starter_model, tmp_path):
    model_dir = without_fim_tokens(tiny_starter_model, tmp_path / "model")
    assert base_model_register(name="plain", path=model_dir).family == "plain"


def test_an_unknown_family_is_refused(db, tiny_starter_model):
    with pytest.raises(ValidationFailed, match="family: 'gpt2'"):
        base_model_register(name="x", path=tiny_starter_model, family="gpt2")


def test_versions_get_numbers_names_lineage_and_their_own_directories(tenant, adapter, make_lora_adapter):
    first = register(tenant, adapter, make_lora_adapter(seed=1))
    second = register(tenant, adapter, make_lora_adapter(seed=2), parent=first)
    assert (first.number, second.number) == (1, 2)
    assert first.vllm_name.startswith("acme--autocomplete--v1-") and second.vllm_name.startswith(
        "acme--autocomplete--v2-"
    )
    assert Path(first.artifact_path).name == first.vllm_name.rsplit("--", 1)[1]
    assert second.parent == first and first.lora_rank == 8
    assert first.artifact_path != second.artifact_path
    for version in (first, second):
        assert (Path(version.artifact_path) / "adapter_model.safetensors").is_file()
        assert not Path(version.artifact_path + ".tmp").exists()


def test_registering_the_same_weights_twice_never_reuses_a_directory_or_name(tenant, adapter, make_lora_adapter):
    source = make_lora_adapter(seed=3)
    first, second = register(tenant, adapter, source), register(tenant, adapter, source)
    assert first.artifact_path != second.artifact_path and first.vllm_name != second.vllm_name


def test_an_invalid_adapter_is_refused_and_leaves_nothing(tenant, adapter, tmp_path, make_lora_adapter):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (broken / "adapter_model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ValidationFailed, match="unreadable"):
        register(tenant, adapter, broken)
    with override_settings(VLLM_MAX_LORA_RANK=4), pytest.raises(ValidationFailed, match="serving limit"):
        register(tenant, adapter, make_lora_adapter(seed=4, rank=8))
    assert not AdapterVersion.objects.exists()


def test_promotion_needs_a_loaded_version_and_moves_the_pointer(tenant, adapter, make_lora_adapter):
    first = register(tenant, adapter, make_lora_adapter(seed=5))
    with pytest.raises(Conflict, match="not loaded"):
        adapter_version_promote(tenant, version=first, actor="test")
    adapter_version_mark_loaded(first)
    adapter_version_promote(tenant, version=first, actor="test")
    second = adapter_version_mark_loaded(register(tenant, adapter, make_lora_adapter(seed=6), parent=first))
    adapter = adapter_version_promote(tenant, version=second, actor="test")
    first.refresh_from_db()
    assert adapter.production_version == second
    assert (first.status, AdapterVersion.objects.get(pk=second.pk).status) == ("retired", "production")
    promote = AuditEvent.objects.filter(tenant=tenant, action="adapter.promote").order_by("-id").first()
    assert promote.data == {"from": first.vllm_name, "to": second.vllm_name}

    # The serving lookup reads the adapter, its base and its production version as the ORM does.
    from django.forms.models import model_to_dict

    found = adapter_get_for_tenant(tenant, name=None)
    orm = Adapter.objects.select_related("base_model", "production_version").get(pk=adapter.pk)
    for ours, theirs in ((found, orm), (found.base_model, orm.base_model), (found.production_version, second)):
        theirs.refresh_from_db()
        assert type(ours) is type(theirs) and model_to_dict(ours) == model_to_dict(theirs)
        assert [getattr(ours, f.attname) for f in type(ours)._meta.concrete_fields] == [
            getattr(theirs, f.attname) for f in type(theirs)._meta.concrete_fields
        ]


def test_adapters_are_found_by_name_or_default_and_only_in_their_tenant(tenant, adapter, make_tenant, tiny_base):
    assert adapter_get_for_tenant(tenant, name="autocomplete") == adapter
    assert adapter_get_for_tenant(tenant, name=None) == adapter
    assert adapter_get_for_tenant(tenant, name=None).production_version is None
    assert adapter_get_for_tenant(tenant, name=None).base_model == tiny_base
    second = adapter_create(tenant, name="chat", base_model=tiny_base)
    assert adapter_get_for_tenant(tenant, name="chat") == second
    other = make_tenant("other")
    with pytest.raises(NotFound):
        adapter_get_for_tenant(other, name="autocomplete")
    with pytest.raises(NotFound, match="no default adapter"):
        adapter_get_for_tenant(other, name=None)


def test_one_default_adapter_per_tenant(tenant, adapter, tiny_base):
    second = adapter_create(tenant, name="chat", base_model=tiny_base, is_default=True)
    assert list(Adapter.objects.filter(tenant=tenant, is_default=True)) == [second]
    with pytest.raises(Conflict):
        adapter_create(tenant, name="chat", base_model=tiny_base)
