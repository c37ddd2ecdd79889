"""What the pages say and what their forms do (Django test client)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from apps.adapters.models import AdapterVersion
from apps.tenants.models import ApiKey, AuditEvent
from apps.training.models import TrainingPolicy, TrainingRun
from tests.dashboard.conftest import log_events
from tests.dashboard.routes import ACTIONS, url_for

pytestmark = pytest.mark.django_db


def _policy_data(**changes):
    return {**ACTIONS["training-policy"][1], **changes}


def test_home_goes_to_the_only_tenant_lists_several_and_explains_none(client, world, make_user):
    client.force_login(world.users["admin"])
    assert client.get("/dashboard/").url == f"/dashboard/t/{world.a.slug}/"
    from apps.tenants.services import membership_create

    membership_create(world.b, user=world.users["admin"], role="viewer")
    body = client.get("/dashboard/").content.decode()
    assert world.a.name in body and world.b.name in body
    page = client.get(url_for("overview", world)).content.decode()
    assert "Switch tenant" in page
    client.force_login(make_user("nobody"))
    assert "not a member of any tenant" in client.get("/dashboard/").content.decode()


def test_the_overview_states_its_definitions_and_the_production_version(login, world):
    body = login(world.users["viewer"]).get(url_for("overview", world)).content.decode()
    assert "accepted ÷ shown" in body and "How these are counted" in body
    assert 'data-stat="production">v1' in body
    assert 'hx-trigger="every 5s"' in body
    assert "Start training run" not in body  # a viewer sees no action


def test_the_overview_says_a_partial_accept_is_shown_as_its_acceptance_rate_counts_it(login, world):
    from apps.dashboard.stats import adapter_live_numbers
    from apps.interactions.rollups import rollups_refresh
    from apps.interactions.services import feedback_ingest
    from apps.training.selectors import training_policy_get

    [interaction_id] = log_events(world.a, outcomes=[None], version=world.v1, refresh=False)
    feedback_ingest(world.a, items=[{"interaction_id": interaction_id, "outcome": "partial", "accepted_chars": 6}])
    rollups_refresh(world.a.pk)

    hour = adapter_live_numbers(world.adapter, policy=training_policy_get(world.adapter)).last_hour
    body = login(world.users["viewer"]).get(url_for("overview", world)).content.decode()

    assert (hour.shown, hour.accepted) == (4, 1)  # the world's accepted, rejected and edited, and the partial
    assert "shown = accepted + rejected + edited + partial" in body


def test_the_live_fragment_is_the_live_section_alone(login, world):
    body = login(world.users["viewer"]).get(url_for("overview-live", world)).content.decode()
    assert body.lstrip().startswith('<section id="live"') and "<html" not in body


def test_the_versions_page_shows_the_lineage_gate_and_the_promote_link_for_admins(login, world):
    body = login(world.users["admin"]).get(url_for("versions", world)).content.decode()
    assert "trained from v1" in body and "0.012" in body and "Promote v2…" in body
    assert body.index("v1-title") < body.index("v2-title")  # v2 is listed under its parent
    viewer_body = login(world.users["viewer"]).get(url_for("versions", world)).content.decode()
    assert "Promote v2" not in viewer_body


def test_the_promote_confirmation_says_exactly_what_changes(login, world):
    body = login(world.users["admin"]).get(url_for("version-promote", world)).content.decode()
    assert "moves from\n      <strong>v1</strong> to <strong>v2</strong>" in body
    assert "v1 becomes <em>retired</em>" in body and "requests that name no model" in body


def test_promoting_an_unloaded_version_with_vllm_down_changes_nothing(login, world, settings, lora_source):
    from apps.adapters.services import adapter_version_register

    settings.VLLM_BASE_URLS = ["http://127.0.0.1:9"]  # nothing listens there
    settings.VLLM_TIMEOUT_S = 2.0
    v3 = adapter_version_register(world.a, adapter=world.adapter, source_dir=lora_source, enqueue_load=False)
    client = login(world.users["admin"])
    url = f"/dashboard/t/{world.a.slug}/adapters/tab/versions/{v3.number}/promote/"
    response = client.post(url, follow=True)
    assert "Nothing changed" in response.content.decode()
    world.adapter.refresh_from_db()
    assert world.adapter.production_version_id == world.v1.pk
    assert AdapterVersion.objects.get(pk=v3.pk).status == "candidate"
    assert not AuditEvent.objects.filter(tenant=world.a, action="adapter.promote", actor__startswith="user:").exists()


def test_policy_errors_from_the_service_sit_beside_their_field(login, world):
    client = login(world.users["admin"])
    url = url_for("training-policy", world)
    response = client.post(url, _policy_data(heldout_fraction="0.95"))
    assert response.status_code == 400
    assert response.context["form"].errors == {"heldout_fraction": ["must be in [0, 0.9)"]}
    response = client.post(url, _policy_data(trainer_overrides='{"no_such_setting": 1}'))
    assert list(response.context["form"].errors) == ["trainer_overrides"]
    response = client.post(url, _policy_data(gate_max_kl="9"))  # the eval gate's knobs are fields of their own
    assert list(response.context["form"].errors) == ["gate_max_kl"]
    response = client.post(url, _policy_data(max_wait_s="-5"))
    assert list(response.context["form"].errors) == ["max_wait_s"]
    assert not TrainingPolicy.objects.filter(adapter=world.adapter).exists()
    assert not AuditEvent.objects.filter(tenant=world.a, action="training_policy.update").exists()


def test_saving_the_policy_audits_only_what_changed(login, world):
    client = login(world.users["admin"])
    data = _policy_data(
        min_new_events="256",
        max_wait_s="3600",
        heldout_fraction="0.1",
        reward_accepted="0.75",
        reward_rejected="-0.25",
        reward_edited="0.25",
        reward_not_shown="0",
    )
    response = client.post(url_for("training-policy", world), {**data, "min_new_events": "32"}, follow=True)
    assert "Training policy saved: min_new_events." in response.content.decode()
    event = AuditEvent.objects.get(tenant=world.a, action="training_policy.update")
    assert event.data == {"min_new_events": 32}
    assert TrainingPolicy.objects.get(adapter=world.adapter).min_new_events == 32


def test_a_new_key_is_shown_once_and_never_cached(login, world):
    client = login(world.users["admin"])
    response = client.post(url_for("keys", world), {"name": "ci", "scopes": ["ingest", "serve"]})
    assert response.status_code == 201 and response["Cache-Control"] == "no-store"
    raw = response.context["issued"].raw_key
    assert raw in response.content.decode()
    key = ApiKey.objects.get(tenant=world.a, name="ci")
    assert key.scopes == ["ingest", "serve"] and key.prefix in raw
    listing = client.get(url_for("keys", world)).content.decode()
    assert raw not in listing and f"strop_{key.prefix}_…" in listing


def test_the_keys_page_offers_and_makes_an_editor_key(login, world):
    client = login(world.users["admin"])
    page = client.get(url_for("keys", world)).content.decode()
    assert 'value="editor"' in page and "editor plugin" in page
    response = client.post(url_for("keys", world), {"name": "continue", "scopes": ["editor"], "default_opt_in": "true"})
    assert response.status_code == 201
    key = ApiKey.objects.get(tenant=world.a, name="continue")
    assert key.scopes == ["editor"] and key.default_opt_in is True


def test_a_key_needs_a_name_and_a_scope(login, world):
    response = login(world.users["admin"]).post(url_for("keys", world), {"name": ""})
    assert response.status_code == 400 and set(response.context["form"].errors) == {"name", "scopes"}
    assert ApiKey.objects.filter(tenant=world.a).count() == 1


def test_starting_a_run_while_one_is_going_says_so_and_changes_nothing(login, world):
    client = login(world.users["admin"])
    client.post(url_for("run-start", world))
    runs = TrainingRun.objects.filter(adapter=world.adapter).count()
    audits = AuditEvent.objects.filter(tenant=world.a, action="training_run.start").count()
    response = client.post(url_for("run-start", world), follow=True)
    assert "No run started: one is already going" in response.content.decode()
    assert TrainingRun.objects.filter(adapter=world.adapter).count() == runs
    assert AuditEvent.objects.filter(tenant=world.a, action="training_run.start").count() == audits
    assert client.get(url_for("run-start", world)).status_code == 405


def test_the_run_page_shows_curves_gate_and_the_error_in_one_line_without_its_traceback(login, world):
    client = login(world.users["viewer"])
    body = client.get(url_for("run-detail", world)).content.decode()
    assert body.count('class="card chart-card"') == 5  # from the row: registration skipped the unreadable line
    assert "Feedback direction" in body and "ROC AUC 0.912 of the model's confidence for what was accepted" in body
    assert "12 accepted, 33 others, +5.3 standard errors" in body
    failed = TrainingRun.objects.create(
        tenant=world.a,
        adapter=world.adapter,
        status="failed",
        error='Traceback (most recent call last):\n  File "/srv/strop/apps/training/pipeline.py", line 9\n'
        + "x" * 5000
        + "\nMemoryError: the trainer ran out of memory",
    )
    body = client.get(f"/dashboard/t/{world.a.slug}/runs/{failed.pk}/").content.decode()
    assert "MemoryError: the trainer ran out of memory" in body
    assert "x" * 100 not in body and "/srv/strop" not in body and "Traceback" not in body
    assert "no output version" in body and "never reached the gate" in body


def test_a_rejected_runs_page_offers_to_leave_its_events_out_and_then_says_when_and_who(login, world):
    run = TrainingRun.objects.create(
        tenant=world.a, adapter=world.adapter, status="rejected", window_size=40, heldout_size=8,
        gate={"passed": False, "reasons": ["the window's feedback runs against the model"]},
    )  # fmt: skip
    url = f"/dashboard/t/{world.a.slug}/runs/{run.pk}/"
    viewer = login(world.users["viewer"]).get(url).content.decode()
    assert "does not use up its 48 events" in viewer and "Leave these events out of training" not in viewer
    admin = login(world.users["admin"])
    assert "Leave these events out of training" in admin.get(url).content.decode()
    body = admin.post(f"{url}exclude-window/", follow=True).content.decode()
    assert f"Run #{run.pk}&#x27;s events are left out of training" in body
    admin_pk, admin_name = world.users["admin"].pk, world.users["admin"].username
    assert "Its 48 events were left out of training on" in body and f"{admin_name} (user:{admin_pk})" in body
    assert "Leave these events out of training" not in body
    candidate = login(world.users["admin"]).post(url_for("run-detail", world) + "exclude-window/", follow=True)
    assert f"run {world.run.pk} is candidate" in candidate.content.decode()
    assert admin.get(f"{url}exclude-window/").status_code == 405


def test_an_active_run_polls_its_state_and_a_finished_one_does_not(login, world):
    client = login(world.users["viewer"])
    assert "hx-trigger" not in client.get(url_for("run-status", world)).content.decode()
    from apps.training.services import training_run_start

    run = training_run_start(world.a, adapter=world.adapter, actor="system")
    body = client.get(f"/dashboard/t/{world.a.slug}/runs/{run.pk}/status/").content.decode()
    assert 'hx-trigger="every 5s"' in body and "queued" in body


def test_interaction_filters(login, world):
    log_events(world.a, outcomes=["accepted"] * 3, user="dev-9", minutes_ago=120)
    client = login(world.users["viewer"])
    url = url_for("interactions", world)

    def rows(**query):
        return list(client.get(url, query).context["page"].object_list)

    assert len(rows()) == 8
    assert {i.end_user_id for i in rows(user="dev-9")} == {"dev-9"}
    assert [i.outcome for i in rows(outcome="none")] == [None]
    assert len(rows(outcome="accepted")) == 4
    assert len(rows(version=str(world.v1.pk))) == 5
    oldest = rows()[-1].served_at + timedelta(seconds=1)  # the form reads whole seconds
    assert len(rows(until=oldest.strftime("%Y-%m-%dT%H:%M:%S"))) == 3
    assert len(rows(since=oldest.strftime("%Y-%m-%dT%H:%M:%S"))) == 5
    assert "No interaction matches" in client.get(url, {"user": "nobody"}).content.decode()


def test_interactions_are_paginated_by_keyset_each_once_newest_first(login, world):
    log_events(world.a, outcomes=[None] * 60, minutes_ago=30)
    client = login(world.users["viewer"])
    first = client.get(url_for("interactions", world))
    assert len(first.context["page"].object_list) == 50 and "Older →" in first.content.decode()
    second = client.get(url_for("interactions", world), {"after": first.context["page"].older})
    assert len(second.context["page"].object_list) == 15 and second.context["page"].older is None
    seen = [i.pk for i in first.context["page"].object_list + second.context["page"].object_list]
    assert len(set(seen)) == 65
    served = [i.served_at for i in first.context["page"].object_list + second.context["page"].object_list]
    assert served == sorted(served, reverse=True)
    assert "← Newest" in second.content.decode()
    assert client.get(url_for("interactions", world), {"after": "not a cursor"}).status_code == 200


def test_one_interaction_whole(login, world):
    body = login(world.users["viewer"]).get(url_for("interaction-detail", world)).content.decode()
    for text in ("def add(a, b):", "return a + b", "689", "-0.1", "0.905", "accepted", "0.75"):
        assert text in body, text


@pytest.mark.parametrize(
    ("model", "counted_for"),
    [("", "tab"), ("a-model-strop-does-not-serve", "tab"), ("chat", "chat")],
)
def test_a_logged_interaction_shows_the_reward_of_the_adapter_the_overview_counts_it_for(
    login, world, model, counted_for
):
    from apps.adapters.services import adapter_create
    from apps.training.services import training_policy_update

    chat = adapter_create(world.a, name="chat", base_model=world.adapter.base_model)
    training_policy_update(world.a, adapter=chat, actor="system", changes={"reward_accepted": 0.5})
    [world.interaction_id] = log_events(world.a, outcomes=["accepted"], adapter_name=model)

    body = login(world.users["viewer"]).get(url_for("interaction-detail", world)).content.decode()

    reward = {"tab": "0.75", "chat": "0.5"}[counted_for]
    assert f'{reward} <span class="muted small">(policy of {counted_for})</span>' in body
    assert f"{counted_for} · base model" in body


def test_a_suggestion_the_show_gate_withheld_says_so_with_its_score_and_text(login, world):
    from apps.interactions.models import Interaction

    gate = {"score": -7.25, "threshold": -5.5, "withheld": True, "text": "return a - b"}
    Interaction.objects.filter(pk=world.interaction_id).update(completion="", metadata={"show_gate": gate})
    client = login(world.users["viewer"])
    body = client.get(url_for("interaction-detail", world)).content.decode()
    assert "Withheld by the show gate" in body and "-7.25" in body and "-5.5" in body and "return a - b" in body
    assert "the model chose to suggest nothing" not in body
    assert "(withheld by the show gate)" in client.get(url_for("interactions", world)).content.decode()


def test_audit_log_filters_and_names_users(login, world):
    client = login(world.users["viewer"])
    url = url_for("audit", world)
    response = client.get(url, {"action": "api_key.create"})
    events = list(response.context["page"].object_list)
    assert [e.action for e in events] == ["api_key.create"]
    assert f"olivia (user:{world.users['owner'].pk})" in response.content.decode()
    assert all(e.actor == "system" for e in client.get(url, {"actor": "system"}).context["page"].object_list)


def test_sign_in_sign_out_and_change_password(client, world):
    from tests.dashboard.conftest import PASSWORD

    response = client.post("/dashboard/login/", {"username": "adam", "password": PASSWORD}, follow=True)
    assert response.redirect_chain[-1][0] == f"/dashboard/t/{world.a.slug}/"
    response = client.post(
        "/dashboard/password/",
        {"old_password": PASSWORD, "new_password1": "another-long-secret", "new_password2": "another-long-secret"},
    )
    assert response.url == "/dashboard/password/done/"
    client.post("/dashboard/logout/")
    assert client.get(url_for("overview", world)).status_code == 302
    bad = client.post("/dashboard/login/", {"username": "adam", "password": PASSWORD})
    assert bad.status_code == 200 and "correct username and password" in bad.content.decode()


def test_forms_are_csrf_protected(world):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users["admin"])
    assert client.post(url_for("run-start", world)).status_code == 403
    assert client.post(url_for("keys", world), {"name": "x", "scopes": ["ingest"]}).status_code == 403
    assert ApiKey.objects.filter(tenant=world.a).count() == 1


def test_a_version_that_learned_from_an_erased_user_is_marked_and_admins_can_retrain_its_lineage(login, world):
    from apps.training.models import TrainingRunErasure

    body = login(world.users["admin"]).get(url_for("versions", world)).content.decode()
    assert "erased end user" not in body and "Retrain without erased users" not in body
    TrainingRunErasure.objects.create(tenant=world.a, run=world.run, user_hash="1" * 64, trained_on=True)
    body = login(world.users["admin"]).get(url_for("versions", world)).content.decode()
    assert "learned from 1 erased end user" in body and "Retrain without erased users" in body
    viewer_body = login(world.users["viewer"]).get(url_for("versions", world)).content.decode()
    assert "learned from 1 erased end user" in viewer_body and "Retrain without erased users" not in viewer_body
    response = login(world.users["admin"]).post(url_for("lineage-retrain", world))
    run = TrainingRun.objects.filter(tenant=world.a).order_by("-pk").first()
    assert response.status_code == 302 and response.url.endswith(f"/runs/{run.pk}/")
    assert (run.status, run.parent_version, run.trigger) == ("queued", world.v1, "retrain without erased users")


def test_the_interaction_page_shows_retained_characters_by_checkpoint(login, world):
    from apps.interactions.services import persistence_ingest

    client = login(world.users["viewer"])
    assert "No persistence report yet" in client.get(url_for("interaction-detail", world)).content.decode()
    persistence_ingest(
        world.a,
        items=[
            {"interaction_id": str(world.interaction_id), "checkpoint_s": 600, "text": "return a"},
            {"interaction_id": str(world.interaction_id), "checkpoint_s": 30, "text": "return a + b"},
        ],
    )
    body = client.get(url_for("interaction-detail", world)).content.decode()
    assert "Retained characters" in body
    rows = re.findall(
        r'<tr data-checkpoint="(\d+)"><th scope="row">\d+ s</th><td class="mono">(\d+)</td>'
        r'<td class="mono">(\d+)</td><td class="mono">(\d+) %</td>',
        body,
    )
    assert rows == [("30", "12", "12", "100"), ("600", "12", "8", "67")]
