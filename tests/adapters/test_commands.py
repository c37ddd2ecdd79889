from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from apps.adapters.models import Adapter, BaseModel

pytestmark = pytest.mark.django_db


def test_operator_registers_a_base_model_and_an_adapter(tenant, tiny_starter_model):
    call_command("base_model_register", "starter", str(tiny_starter_model), stdout=io.StringIO())
    assert BaseModel.objects.get(name="starter").family == "qwen"
    call_command("adapter_create", tenant.slug, "tab", "--base", "starter", "--default", stdout=io.StringIO())
    assert Adapter.objects.get(tenant=tenant, name="tab").is_default
    call_command("adapter_create", tenant.slug, "tab", "--base", "starter", "--exists-ok", stdout=io.StringIO())
    with pytest.raises(CommandError, match="no base model"):
        call_command("adapter_create", tenant.slug, "x", "--base", "missing", stdout=io.StringIO())


def test_registering_a_base_model_prints_and_records_its_source_and_fingerprint(db, tiny_starter_model):
    from learning_shared.fingerprint import base_model_fingerprint

    out = io.StringIO()
    call_command("base_model_register", "starter", str(tiny_starter_model), stdout=out)
    base = BaseModel.objects.get(name="starter")
    assert base.fingerprint == base_model_fingerprint(tiny_starter_model)
    assert base.source
    assert f"source: {base.source}" in out.getvalue() and f"fingerprint: {base.fingerprint}" in out.getvalue()
