"""Every training-policy setting the API has is on the policy page: the show gate and automatic
experiments too, with a bad value named beside its field and nothing saved."""

from __future__ import annotations

import pytest

from apps.training.models import TrainingPolicy
from tests.dashboard.routes import ACTIONS, url_for

pytestmark = pytest.mark.django_db


def test_the_show_gate_and_automatic_experiments_are_set_on_the_policy_page(login, world):
    client = login(world.users["admin"])
    data = {**ACTIONS["training-policy"][1], "show_gate_recall": "0.9", "auto_experiment": "on"}
    data.pop("show_gate")
    client.post(url_for("training-policy", world), data)
    policy = TrainingPolicy.objects.get(adapter=world.adapter)
    assert (policy.show_gate, policy.show_gate_recall, policy.auto_experiment) == (False, 0.9, True)


def test_rewarding_what_developers_keep_is_set_on_the_policy_page(login, world):
    client = login(world.users["admin"])
    page = client.get(url_for("training-policy", world)).content.decode()
    assert 'name="credit_retained"' in page
    client.post(url_for("training-policy", world), {**ACTIONS["training-policy"][1], "credit_retained": "on"})
    assert TrainingPolicy.objects.get(adapter=world.adapter).credit_retained is True
    client.post(url_for("training-policy", world), ACTIONS["training-policy"][1])
    assert TrainingPolicy.objects.get(adapter=world.adapter).credit_retained is False


def test_a_recall_out_of_range_is_named_beside_its_field_and_nothing_is_saved(login, world):
    client = login(world.users["admin"])
    before = TrainingPolicy.objects.filter(adapter=world.adapter).values().first()
    response = client.post(
        url_for("training-policy", world), {**ACTIONS["training-policy"][1], "show_gate_recall": "0.2"}
    )
    assert response.status_code == 400
    page = response.content.decode()
    beside = page.split('id="id_show_gate_recall_error">', 1)[1].split("</p>", 1)[0]
    assert "0.5" in beside and "1" in beside  # the allowed range, beside the field
    assert TrainingPolicy.objects.filter(adapter=world.adapter).values().first() == before


def test_the_tenants_settings_are_changed_on_their_page_and_audited(login, world):
    from apps.tenants.models import AuditEvent, Tenant

    viewer = login(world.users["viewer"])
    assert viewer.post(url_for("settings", world), {"default_opt_in": "on"}).status_code == 403
    client = login(world.users["admin"])
    before = Tenant.objects.get(pk=world.a.pk)
    data = {"default_opt_in": "on", "experiment_auto_promote": "on"}
    if before.accept_pending_feedback:
        data["accept_pending_feedback"] = "on"
    client.post(url_for("settings", world), data)
    tenant = Tenant.objects.get(pk=world.a.pk)
    assert (tenant.default_opt_in, tenant.experiment_auto_promote, tenant.experiment_auto_rollback) == (
        True,
        True,
        False,
    )
    assert AuditEvent.objects.filter(tenant=world.a, action="tenant.settings").count() == 1


def test_a_key_made_on_the_dashboard_takes_its_default_consent(login, world):
    from apps.tenants.models import ApiKey

    client = login(world.users["admin"])
    client.post(url_for("keys", world), {"name": "opted-in editor", "scopes": ["ingest"], "default_opt_in": "true"})
    assert ApiKey.objects.get(tenant=world.a, name="opted-in editor").default_opt_in is True


def test_an_eval_set_is_replaced_from_a_jsonl_file_and_a_bad_line_is_named(login, world):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from apps.training.models import EvalSet

    client = login(world.users["admin"])
    good = b'{"prefix": "def f(", "suffix": "):", "middle": "x"}\n\n{"prefix": "a", "suffix": "b", "middle": "c"}\n'
    client.post(url_for("eval-set", world), {"file": SimpleUploadedFile("cases.jsonl", good)})
    assert len(EvalSet.objects.get(adapter=world.adapter).cases) == 2

    bad = b'{"prefix": "a", "suffix": "b", "middle": "c"}\n{"prefix": \n'
    response = client.post(url_for("eval-set", world), {"file": SimpleUploadedFile("cases.jsonl", bad)})
    assert response.status_code == 400 and "line 2: not valid JSON" in response.content.decode()
    wrong = b'[{"prefix": "a", "middle": "c"}]'
    response = client.post(url_for("eval-set", world), {"file": SimpleUploadedFile("cases.json", wrong)})
    assert (
        response.status_code == 400
        and "cases[0]: must hold exactly prefix, suffix and middle" in response.content.decode()
    )
    assert len(EvalSet.objects.get(adapter=world.adapter).cases) == 2  # unchanged by the refused uploads


def test_the_feedback_check_is_explained_and_can_be_turned_off_on_the_policy_page(login, world):
    client = login(world.users["admin"])
    page = client.get(url_for("training-policy", world)).content.decode()
    assert "How far feedback may run against the model" in page and "0 turns the check off" in page
    client.post(url_for("training-policy", world),
                {**ACTIONS["training-policy"][1], "gate_feedback_direction_z": "0"})
    assert TrainingPolicy.objects.get(adapter=world.adapter).gate_overrides == {"feedback_direction_z": 0.0}
    page = client.get(url_for("training-policy", world)).content.decode()
    field = page.split('name="gate_feedback_direction_z"', 1)[1].split(">", 1)[0]
    assert 'value="0' in field  # shown as set, so saving the page again keeps it off


def test_the_retention_is_set_on_the_settings_page_within_the_operators_maximum(login, world, settings):
    from apps.tenants.models import AuditEvent, Tenant

    settings.STROP_RETENTION_MAX_DAYS = 365
    client = login(world.users["admin"])
    page = client.get(url_for("settings", world)).content.decode()
    assert 'name="retention_days"' in page and "At most 365 (the operator&#x27;s maximum)" in page
    tenant = Tenant.objects.get(pk=world.a.pk)
    keep = {
        name: "on"
        for name in ("default_opt_in", "experiment_auto_promote", "experiment_auto_rollback", "accept_pending_feedback")
        if getattr(tenant, name)
    }
    response = client.post(url_for("settings", world), {**keep, "retention_days": "400"})
    assert response.status_code == 400
    beside = response.content.decode().split('id="id_retention_days_error">', 1)[1].split("</p>", 1)[0]
    assert "365" in beside  # the maximum, beside the field
    assert Tenant.objects.get(pk=world.a.pk).retention_days == tenant.retention_days
    client.post(url_for("settings", world), {**keep, "retention_days": "90"})
    assert Tenant.objects.get(pk=world.a.pk).retention_days == 90
    event = AuditEvent.objects.filter(tenant=world.a, action="tenant.settings").latest("id")
    assert "retention_days" in str(event.data)
