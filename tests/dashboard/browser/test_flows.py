"""What a tenant admin does, in a real browser against the live server."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import Page, expect

from apps.tenants.models import ApiKey, AuditEvent
from tests.dashboard.browser.conftest import sign_in, tour_page
from tests.dashboard.conftest import log_events
from tests.dashboard.routes import url_for

pytestmark = pytest.mark.slow


def _stat(page: Page, name: str):
    return page.locator(f'[data-stat="{name}"]')


def test_overview_shows_the_numbers_and_refreshes_them_without_a_reload(page, live_world):
    sign_in(page, live_world.users["admin"])
    expect(page).to_have_url(f"{page.url.split('/dashboard/')[0]}/dashboard/t/{live_world.a.slug}/")
    expect(_stat(page, "production")).to_have_text("v1")
    # The last hour holds the world's five events (accepted, rejected, edited, not shown, no feedback),
    # the traffic of 55 minutes ago (accepted, accepted, edited, rejected) and one long edited
    # completion: 3 accepted of 8 shown.
    expect(_stat(page, "acceptance")).to_have_text("37.5 %")
    expect(page.locator("svg.chart--line")).to_have_count(4)
    page.evaluate("window.__notReloaded = true")
    log_events(live_world.a, outcomes=["accepted", "accepted", "accepted"], minutes_ago=1, version=live_world.v1)
    expect(_stat(page, "acceptance")).to_have_text("54.5 %")  # 6 of 11, swapped in by htmx polling
    assert page.evaluate("window.__notReloaded") is True
    tour_page(page, "flow-overview-after-refresh")


def test_open_a_training_run_with_its_curves_and_gate(page, live_world):
    sign_in(page, live_world.users["admin"])
    page.get_by_role("navigation", name=f"Sections of {live_world.a.name}").get_by_role("link", name="Training").click()
    page.get_by_role("link", name=f"#{live_world.run.pk}").click()
    expect(page.get_by_role("heading", name=f"Training run #{live_world.run.pk}")).to_be_visible()
    expect(page.locator("figure", has_text="Approx. KL").locator("svg path.chart__line")).to_be_visible()
    expect(page.locator("figure.chart-card")).to_have_count(5)
    expect(page.get_by_text("passed").first).to_be_visible()
    expect(page.get_by_text("12 optimizer steps")).to_be_visible()


def test_policy_errors_sit_beside_their_field_and_nothing_is_saved(page, live_world):
    sign_in(page, live_world.users["admin"])
    page.goto(url_for("training-policy", live_world))
    heldout = page.get_by_label("Feedback kept aside to check a new version")
    page.get_by_text("Advanced: how a new version is checked and trained").click()  # where it is kept
    heldout.fill("0.95")
    page.get_by_role("button", name="Save policy").click()
    field = page.locator(".field", has=heldout)
    expect(field.locator(".field__error")).to_have_text("must be in [0, 0.9)")  # Advanced is open again
    expect(heldout).to_have_attribute("aria-invalid", "true")
    tour_page(page, "flow-policy-error")
    assert not AuditEvent.objects.filter(tenant=live_world.a, action="training_policy.update").exists()
    heldout.fill("0.2")
    page.get_by_role("button", name="Save policy").click()
    expect(page.get_by_text("Training policy saved: heldout_fraction.")).to_be_visible()


def test_create_a_key_shown_once_copy_it_and_revoke_it(page, live_world):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    sign_in(page, live_world.users["admin"])
    page.goto(url_for("keys", live_world))
    page.get_by_label("Name").fill("ci pipeline")
    page.get_by_label("ingest").check()
    page.get_by_label("feedback").check()
    page.get_by_role("button", name="Create key").click()
    new_key = page.get_by_label("New API key")
    raw = new_key.input_value()
    assert raw.startswith("strop_")
    page.get_by_role("button", name="Copy").click()
    expect(page.get_by_text("Copied.")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == raw
    tour_page(page, "flow-key-created")
    page.goto(url_for("keys", live_world))
    expect(page.get_by_role("cell", name="ci pipeline")).to_be_visible()
    assert raw not in page.content()  # shown once: never again
    row = page.get_by_role("row", name="ci pipeline")
    row.get_by_role("link", name="Revoke").click()
    page.get_by_role("button", name="Revoke key").click()
    expect(page.get_by_text("is revoked: it stops working now")).to_be_visible()
    expect(page.get_by_role("row", name="ci pipeline").get_by_text("revoked")).to_be_visible()
    assert ApiKey.objects.get(tenant=live_world.a, name="ci pipeline").revoked_at is not None


def test_promote_a_loaded_version_from_the_versions_page(page, live_world):
    from apps.experiments.services import experiment_stop

    # v2 is the world's running experiment's candidate, whose promotion by hand would decide the
    # experiment (loading v2 on every replica: a real vLLM). Stopped, v2 is a loaded candidate.
    experiment_stop(live_world.a, experiment=live_world.experiment, actor="test")
    sign_in(page, live_world.users["admin"])
    page.goto(url_for("versions", live_world))
    page.get_by_role("link", name="Promote v2…").click()
    expect(page.get_by_text("moves from v1 to v2")).to_be_visible()
    page.get_by_role("button", name="Promote v2").click()
    expect(page.get_by_text("v2 now serves tab in production (was v1).")).to_be_visible()
    live_world.adapter.refresh_from_db()
    assert live_world.adapter.production_version_id == live_world.v2.pk


def test_filter_interactions_and_open_one(page, live_world):
    sign_in(page, live_world.users["admin"])
    page.goto(url_for("interactions", live_world))
    page.get_by_label("Outcome").select_option("accepted")
    page.get_by_label("End user").fill("dev-1")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("table.table--interactions tbody tr")
    expect(rows.first).to_be_visible()
    for text in rows.all_inner_texts():
        assert "accepted" in text and "dev-1" in text
    rows.first.get_by_role("link").click()
    expect(page.get_by_role("heading", name="Completion tokens")).to_be_visible()
    expect(page.get_by_role("cell", name="689")).to_be_visible()
    expect(page.get_by_role("cell", name="-0.1", exact=True)).to_be_visible()


@pytest.mark.vllm
def test_promote_loads_an_unloaded_version_into_vllm_first(page, live_world, served, make_lora_adapter, make_user):
    """The real vLLM: promoting a version vLLM does not hold yet loads it, then moves the pointer."""
    from apps.adapters.services import adapter_create, adapter_version_register, base_model_register

    base = base_model_register(name=served.served_model_name, path=served.model_dir)
    adapter = adapter_create(live_world.a, name=f"served-{uuid.uuid4().hex[:6]}", base_model=base)
    version = adapter_version_register(
        live_world.a, adapter=adapter, source_dir=make_lora_adapter(seed=11), enqueue_load=False
    )
    assert version.loaded_at is None
    sign_in(page, live_world.users["owner"])
    page.goto(f"/dashboard/t/{live_world.a.slug}/adapters/{adapter.name}/versions/")
    page.get_by_role("link", name="Promote v1…").click()
    expect(page.get_by_text("is not loaded in vLLM yet: Strop loads it first")).to_be_visible()
    page.get_by_role("button", name="Promote v1").click()
    expect(page.get_by_text(f"v1 now serves {adapter.name} in production (was the base model).")).to_be_visible()
    version.refresh_from_db()
    assert version.loaded_at is not None and version.status == "production"
    assert version.vllm_name in served_models(served)


def served_models(served) -> set[str]:
    import httpx

    listed = httpx.get(f"{served.base_url}/v1/models", headers=served.headers, timeout=30).json()["data"]
    return {m["id"] for m in listed}


def test_keyboard_skip_link_and_menus(page, live_world):
    from apps.tenants.services import membership_create

    membership_create(live_world.b, user=live_world.users["admin"], role="viewer")
    sign_in(page, live_world.users["admin"])
    page.goto(url_for("overview", live_world))
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main#main")).to_be_focused()
    switcher = page.locator("details.menu--tenant > summary")
    switcher.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("link", name=live_world.b.name)).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.get_by_role("link", name=live_world.b.name)).to_be_hidden()
    expect(switcher).to_be_focused()


def test_a_chat_interaction_shows_its_conversation_tool_calls_and_session(page, live_world):
    from apps.interactions.services import feedback_ingest, interactions_ingest

    asked = [
        {"role": "system", "content": "You edit code."},
        {"role": "user", "content": "Rename x to count in utils.py"},
    ]
    edit = {"name": "edit_file", "arguments": '{"path": "utils.py"}'}
    called = {"id": "call-1", "type": "function", "function": edit}
    answered = [
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [called]},
        {"role": "tool", "tool_call_id": "call-1", "content": "renamed 4 uses"},
    ]
    common = {"conversation_id": "session-17", "end_user_id": "dev-1", "opted_in": True, "model": "tab"}
    first, second = interactions_ingest(
        live_world.a,
        items=[
            {**common, "client_id": "turn-0", "messages": asked, "completion": "", "turn": 0,
             "metadata": {"tool_calls": [called]}},
            {**common, "client_id": "turn-1", "messages": answered, "completion": "Done: renamed 4 uses.", "turn": 1},
        ],
    )
    feedback_ingest(live_world.a, items=[{"conversation_id": "session-17", "turn": 1, "discount": 0.5,
                                           "outcome": "thumbs_up"}])
    sign_in(page, live_world.users["viewer"])
    page.goto(f"/dashboard/t/{live_world.a.slug}/interactions/{second.id}/")
    expect(page.get_by_role("heading", name="Conversation")).to_be_visible()
    expect(page.get_by_text("Rename x to count in utils.py")).to_be_visible()
    expect(page.get_by_text('→ edit_file({"path": "utils.py"})')).to_be_visible()
    expect(page.get_by_text("answers call-1")).to_be_visible()
    expect(page.get_by_text("the session outcome, weight 1")).to_be_visible()
    expect(page.get_by_text("turn 1 (this one)")).to_be_visible()
    expect(page.get_by_text("from the session outcome").first).to_be_visible()
    tour_page(page, "interaction-chat")
    page.get_by_role("link", name="turn 0").click()
    expect(page.get_by_role("heading", name="Completion", exact=True)).to_be_visible()
    expect(page.locator(".code--completion")).to_have_text('→ edit_file({"path": "utils.py"})')
    page.goto(url_for("interactions", live_world))
    expect(page.get_by_text("chat · turn 1")).to_be_visible()
    expect(page.get_by_role("row").filter(has_text="chat · turn 0")).to_contain_text("(tool call)")
