"""A new tenant's first hour in the browser: the overview guides to the first event with the
tenant's own values, and turns into the live overview by itself when that event arrives."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import sign_in, tour_page
from tests.dashboard.conftest import log_events


@pytest.mark.slow
def test_the_first_event_turns_the_first_run_panel_into_the_overview(
    page, live_server, transactional_db, make_tenant, make_user, tiny_starter_model
):
    from apps.adapters.services import adapter_create, base_model_register

    tenant = make_tenant("acme")
    base = base_model_register(name="base", path=tiny_starter_model)
    adapter_create(tenant, name="tab", base_model=base, is_default=True)
    sign_in(page, make_user("ada", tenant, "admin"))
    page.goto("/dashboard/t/acme/")
    panel = page.locator("#first-run")
    expect(panel.get_by_role("heading", name="Send Acme's first event")).to_be_visible()
    expect(page.locator("#snippet-env")).to_contain_text(f"export STROP_BASE_URL={live_server.url} STROP_API_KEY=")
    expect(page.locator("#snippet-curl")).to_contain_text('"model": "tab"')
    expect(page.locator("#snippet-sdk")).to_contain_text('model="tab"')
    expect(panel.get_by_role("link", name="API keys")).to_have_attribute("href", "/dashboard/t/acme/keys/")
    page.get_by_role("button", name="Copy the curl command").click()
    expect(panel.locator("[data-copy-status]")).to_have_text(re.compile("Copied|Selected"))
    tour_page(page, "first-run")

    log_events(tenant, outcomes=["accepted"])  # the first event, as the quickstart's curl sends it
    expect(page.locator("#live")).to_be_visible()  # the page reloaded by itself into the overview
    expect(page.locator("#first-run")).to_have_count(0)
    expect(page.get_by_role("heading", name="Over time")).to_be_visible()
