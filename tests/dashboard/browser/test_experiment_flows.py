"""A tenant admin at an experiment, the versions page and the cohorts, in a real browser."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from apps.adapters.models import AdapterVersion
from apps.cohorts.models import EndUser
from apps.tenants.models import AuditEvent
from tests.dashboard.browser.conftest import sign_in, tour_page
from tests.dashboard.conftest import feed_experiment
from tests.dashboard.routes import url_for

pytestmark = pytest.mark.slow


def _stat(page: Page, name: str):
    return page.locator(f'[data-stat="{name}"]')


@pytest.mark.vllm
def test_watch_a_running_experiment_compare_the_arms_and_promote_the_candidate(page, live_world, served):
    world = live_world
    sign_in(page, world.users["admin"])
    page.get_by_role("navigation", name=f"Sections of {world.a.name}").get_by_role("link", name="Experiments").click()
    page.get_by_role("link", name=f"experiment #{world.experiment.pk}").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Experiment #{world.experiment.pk}: v2 against v1")
    # 96 simulated users and the world's two: 49 a side, the split as configured.
    expect(_stat(page, "users-control")).to_have_text("49")
    expect(_stat(page, "users-candidate")).to_have_text("49")
    expect(_stat(page, "srm")).to_have_text("SRM: OK")
    primary = page.locator('tr[data-metric="reward_per_request"]')
    expect(primary.get_by_text("significantly better")).to_be_visible()
    expect(primary.locator("svg.chart--lift-better")).to_be_visible()
    expect(page.locator("svg.chart--band polygon.chart__band")).to_be_visible()
    expect(_stat(page, "decision")).to_have_text("Promote the candidate")
    tour_page(page, "flow-experiment")

    # More users arrive and beat takes a snapshot: the page shows them without a reload.
    page.evaluate("window.__notReloaded = true")
    feed_experiment(world, users=20, prefix="late", minutes_ago=26 * 60)
    expect(_stat(page, "users-control")).to_have_text("59")
    expect(_stat(page, "users-candidate")).to_have_text("59")
    assert page.evaluate("window.__notReloaded") is True

    page.get_by_role("link", name="Promote v2…").click()
    expect(page.get_by_text("moves from v1 to v2")).to_be_visible()
    expect(page.get_by_text("The statistics say:")).to_be_visible()
    tour_page(page, "flow-experiment-promote-confirm")
    page.get_by_label("Reason (kept in the audit log)").fill("clearly better")
    page.get_by_role("button", name="Promote v2").click()
    expect(page.get_by_text("Promoted: v2 now serves tab in production.")).to_be_visible()
    expect(page.get_by_role("heading", name="Decided: promote")).to_be_visible()
    expect(page.get_by_role("link", name="Promote v2…")).to_have_count(0)

    page.get_by_role("navigation", name=f"Sections of {world.a.name}").get_by_role("link", name="Overview").click()
    expect(_stat(page, "production")).to_have_text("v2")
    event = AuditEvent.objects.get(tenant=world.a, action="experiment.promote")
    assert event.actor == f"user:{world.users['admin'].pk}" and event.data["reason"] == "clearly better"
    assert event.data["stats"]["decision"]["action"] == "promote"


@pytest.mark.vllm
def test_roll_back_to_an_earlier_version_from_the_versions_page(page, live_world, served):
    from apps.adapters.services import adapter_version_promote

    world = live_world
    adapter_version_promote(world.a, version=world.v2, actor="system")
    sign_in(page, world.users["owner"])
    page.goto(url_for("versions", world))
    page.get_by_role("link", name="Roll back to v1…").click()
    expect(page.get_by_text("moves back from v2 to v1")).to_be_visible()
    expect(page.get_by_text("is stopped first")).to_be_visible()
    tour_page(page, "flow-version-rollback-confirm")
    page.get_by_role("button", name="Roll back to v1").click()
    expect(page.get_by_text("Rolled back: v1 serves tab in production (was v2).")).to_be_visible()
    world.adapter.refresh_from_db()
    assert world.adapter.production_version_id == world.v1.pk
    assert AdapterVersion.objects.get(pk=world.v2.pk).status == "retired"
    assert AuditEvent.objects.filter(tenant=world.a, action="adapter.rollback").count() == 1
    world.experiment.refresh_from_db()
    assert world.experiment.status == "stopped"


def test_opt_a_user_out_and_erase_another(page, live_world):
    world = live_world
    sign_in(page, world.users["admin"])
    page.get_by_role("navigation", name=f"Sections of {world.a.name}").get_by_role("link", name="Cohorts").click()
    expect(page.locator("svg.chart--line")).to_be_visible()
    page.get_by_label("End user id").fill("dev-1")
    page.get_by_role("button", name="Search").click()
    page.get_by_role("link", name="dev-1", exact=True).click()
    expect(_stat(page, "consent")).to_have_text("Opted in")
    tour_page(page, "flow-end-user")
    page.get_by_role("button", name="Opt out").click()
    expect(page.get_by_text("dev-1 is opted out")).to_be_visible()
    expect(_stat(page, "consent")).to_have_text("Opted out")
    expect(page.locator("ol.timeline li").first).to_contain_text("opted out")
    assert not EndUser.objects.get(tenant=world.a, external_id="dev-1").opted_in

    page.goto(url_for("cohorts", world))
    page.get_by_label("End user id").fill("dev-2")
    page.get_by_role("button", name="Search").click()
    page.get_by_role("link", name="dev-2", exact=True).click()
    page.get_by_role("link", name="Erase…").click()
    interactions = page.locator('[data-erase="interactions"]')
    expect(interactions).to_have_text(re.compile(r"^[1-9]\d*$"))
    tour_page(page, "flow-end-user-erase-confirm")
    page.get_by_role("button", name="Erase this end user").click()
    expect(page.get_by_text(re.compile(r"^Erased dev-2: "))).to_be_visible()
    assert not EndUser.objects.filter(tenant=world.a, external_id="dev-2").exists()
    assert AuditEvent.objects.filter(tenant=world.a, action="end_user.erase").count() == 1


def test_the_start_form_shows_errors_beside_their_fields(page, live_world):
    from apps.adapters.services import adapter_version_register
    from apps.experiments.services import experiment_stop

    world = live_world
    experiment_stop(world.a, experiment=world.experiment, actor="system")
    adapter_version_register(world.a, adapter=world.adapter, source_dir=world.v2.artifact_path, enqueue_load=False)
    created = AuditEvent.objects.filter(tenant=world.a, action="experiment.create").count()
    sign_in(page, world.users["admin"])
    page.goto(url_for("experiments", world))
    page.get_by_role("link", name="New experiment…").click()
    tour_page(page, "flow-experiment-new")
    page.get_by_label("Candidate share").fill("1.5")
    page.get_by_label("Mean reward per request").first.check()
    page.get_by_role("button", name="Start experiment").click()
    field = page.locator(".field", has=page.get_by_label("Candidate share"))
    expect(field.locator(".field__error")).to_have_text("Ensure this value is less than or equal to 0.99.")
    expect(page.get_by_text("The primary metric cannot also be a guardrail")).to_be_visible()
    tour_page(page, "flow-experiment-new-errors")
    assert AuditEvent.objects.filter(tenant=world.a, action="experiment.create").count() == created
