"""The training policy in a browser: the ML settings wait behind "Advanced", and a bad one brings
them back into view with its error under it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.dashboard.browser.conftest import sign_in, tour_page
from tests.dashboard.routes import url_for


@pytest.mark.slow
def test_an_out_of_range_gate_setting_opens_advanced_with_the_error_under_it(page, live_world):
    sign_in(page, live_world.users["admin"])
    page.goto(url_for("training-policy", live_world))
    max_kl = page.get_by_label("How far a new version may move from its parent")
    expect(max_kl).to_be_hidden()  # behind Advanced
    expect(page.get_by_label("Thumbs up")).to_have_count(0)  # a tab-completion adapter: no agent rewards
    page.get_by_text("Advanced: how a new version is checked and trained").click()
    max_kl.fill("9")
    page.get_by_role("button", name="Save policy").click()
    expect(page.get_by_role("alert")).to_contain_text("Please correct the fields marked below.")
    expect(max_kl).to_be_visible()  # the page came back with Advanced open
    field = page.locator(".field", has=max_kl)
    expect(field.locator(".field__error")).to_contain_text("less than or equal to 5")
    tour_page(page, "training-policy-advanced-errors")
