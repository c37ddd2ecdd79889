"""Every dashboard page, at desktop and phone width: a screenshot each, and no serious or critical
accessibility violation (axe-core). The list of pages is checked against the URL resolver."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import sign_in, tour_page
from tests.dashboard.routes import ACCOUNT, CONFIRM, PUBLIC, READ, dashboard_routes, url_for

# Fragments that htmx swaps into a page; they are seen inside the overview and the run page.
FRAGMENTS = {"overview-live", "run-status", "experiment-live"}
# Routes that only answer POST.
POST_ONLY = {
    "logout",
    "run-start",
    "lineage-retrain",
    "end-user-consent",
    "experiments-holdout",
    "run-exclude-window",
}
# Routes that answer a file to download, not a page.
DOWNLOADS = {"interactions-csv", "experiment-results-csv"}
PAGES = sorted((READ | CONFIRM | ACCOUNT | PUBLIC) - FRAGMENTS - POST_ONLY - DOWNLOADS - {"login"})


def test_the_tour_covers_every_page_route():
    assert set(dashboard_routes()) == set(PAGES) | FRAGMENTS | POST_ONLY | DOWNLOADS | {"login"}


@pytest.mark.slow
def test_every_page_at_desktop_and_phone_width(page, live_world):
    page.goto("/dashboard/login/")
    tour_page(page, "login")
    # The owner is in two tenants, so the header shows the tenant switcher and home lists both.
    from apps.tenants.services import membership_create

    membership_create(live_world.b, user=live_world.users["owner"], role="viewer")
    # v2 learned from an end user erased since: its badge and the retrain action are on the tour.
    from apps.training.models import TrainingRunErasure

    TrainingRunErasure.objects.create(tenant=live_world.a, run=live_world.run, user_hash="2" * 64, trained_on=True)
    sign_in(page, live_world.users["owner"])
    for name in PAGES:
        page.goto(url_for(name, live_world))
        expect(page.get_by_role("heading", level=1)).to_be_visible()
        tour_page(page, name)


@pytest.mark.slow
def test_empty_states_and_not_found(page, live_world, make_tenant, make_user):
    empty = make_tenant("empty-co")
    user = make_user("erin", empty, "admin")
    sign_in(page, user)
    for name in ("overview", "interactions", "runs"):
        page.goto(f"/dashboard/t/empty-co/{'' if name == 'overview' else name + '/'}")
        expect(page.locator(".empty-state")).to_be_visible()
        tour_page(page, f"empty-{name}")
    # An invalid filter: its error beside the field, and the empty state says why nothing is listed.
    page.goto("/dashboard/t/empty-co/interactions/?user=dev-1&since=yesterday")
    expect(page.locator(".empty-state")).to_contain_text("A filter is invalid")
    expect(page.get_by_text("Enter a valid date/time.")).to_be_visible()
    tour_page(page, "interactions-invalid-filter")
    response = page.goto(f"/dashboard/t/{live_world.a.slug}/")
    assert response is not None and response.status == 404
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    tour_page(page, "not-found")


@pytest.mark.slow
def test_a_viewer_sees_no_action_and_gets_a_message_when_acting(page, live_world):
    sign_in(page, live_world.users["viewer"])
    page.goto(url_for("versions", live_world))
    expect(page.get_by_role("heading", name="v2")).to_be_visible()
    expect(page.get_by_role("link", name="Promote v2…")).to_have_count(0)
    page.goto(url_for("version-promote", live_world))
    expect(page.get_by_role("heading", name="Your role can read, not act")).to_be_visible()
    tour_page(page, "forbidden")


@pytest.mark.slow
def test_a_rejected_runs_events_left_out_of_training(page, live_world):
    from apps.training.models import TrainingRun

    reason = (
        "the window's feedback runs against the model: its 40 accepted suggestions scored lower than the 120 "
        "others (ROC AUC 0.08, 8.1 standard errors below 0.5)"
    )
    gate = {
        "passed": False, "reasons": [reason], "feedback_check": "failed", "kl_check": "skipped",
        "feedback_direction": {"auc": 0.08, "accepted": 40, "others": 120, "z": -8.1},
        "notes": ["stopped before training: nothing was trained on this window"],
    }  # fmt: skip
    run = TrainingRun.objects.create(
        tenant=live_world.a, adapter=live_world.adapter, status="rejected", window_size=230, heldout_size=26,
        gate=gate, stage_seconds={"export": 1.2},
    )  # fmt: skip
    sign_in(page, live_world.users["admin"])
    page.goto(f"/dashboard/t/{live_world.a.slug}/runs/{run.pk}/")
    expect(page.get_by_text("does not use up its 256 events")).to_be_visible()
    tour_page(page, "run-rejected")
    page.get_by_role("button", name="Leave these events out of training").click()
    expect(page.get_by_text("Its 256 events were left out of training on")).to_be_visible()
    expect(page.get_by_role("button", name="Leave these events out of training")).to_have_count(0)
    tour_page(page, "run-rejected-left-out")


@pytest.mark.slow
def test_a_suggestion_the_show_gate_withheld(page, live_world):
    from apps.interactions.models import Interaction

    gate = {"score": -7.25, "threshold": -5.5, "withheld": True, "text": "return a - b"}
    Interaction.objects.filter(pk=live_world.interaction_id).update(completion="", metadata={"show_gate": gate})
    sign_in(page, live_world.users["viewer"])
    page.goto(url_for("interaction-detail", live_world))
    expect(page.get_by_text("Withheld by the show gate")).to_be_visible()
    tour_page(page, "interaction-withheld")
    page.goto(url_for("interactions", live_world))
    expect(page.get_by_text("(withheld by the show gate)")).to_be_visible()
    tour_page(page, "interactions-withheld")


@pytest.mark.slow
def test_an_interactions_retained_characters_by_checkpoint(page, live_world):
    from apps.interactions.services import persistence_ingest

    items = [
        {"interaction_id": str(live_world.interaction_id), "checkpoint_s": s, "text": text}
        for s, text in ((30, "return a + b"), (120, "return a + b  # sum"), (600, "return a"))
    ]
    persistence_ingest(live_world.a, items=items)
    sign_in(page, live_world.users["viewer"])
    page.goto(url_for("interaction-detail", live_world))
    expect(page.get_by_role("heading", name="Retained characters")).to_be_visible()
    expect(page.locator("tr[data-checkpoint]")).to_have_count(3)
    tour_page(page, "interaction-retained")
