"""The cohorts page of a tenant past the count cap, in a real browser: the capped counts and their
note, the chart of the change, keyset pages and a substring search."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from apps.cohorts.services import end_users_observe
from tests.dashboard.browser.conftest import sign_in, tour_page

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_big_cohort_reads_capped_counts_and_pages_by_id(page: Page, make_tenant: Any, make_user: Any, monkeypatch):
    tenant = make_tenant("acme")
    observations = [(f"customer-{n:04d}", n % 4 != 0) for n in range(130)]
    end_users_observe(tenant, observations=observations, source="import", actor="system", default=False)
    monkeypatch.setattr("apps.dashboard.views.cohorts.COUNT_CAP", 90)  # the live server runs in this process
    sign_in(page, make_user("vera", tenant, "viewer"))
    page.goto(reverse("dashboard:cohorts", kwargs={"tenant_slug": tenant.slug}))
    expect(page.locator('[data-stat="known"]')).to_have_text("90+")
    expect(page.locator('[data-stat="opted-in"]')).to_have_text("90+")  # 97
    expect(page.locator('[data-stat="opted-out"]')).to_have_text("33")
    expect(page.locator('[data-note="capped"]')).to_contain_text("Counts stop at 90 here")
    expect(page.locator("figcaption")).to_contain_text("Change in end users opted in")
    tour_page(page, "cohorts-capped")
    page.get_by_role("link", name="Next →").click()
    expect(page.get_by_role("link", name="customer-0050", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="customer-0049", exact=True)).to_have_count(0)
    page.get_by_label("End user id").fill("MER-012")
    page.get_by_role("button", name="Search").click()
    rows = page.get_by_role("region", name="End users found").locator("tbody tr")
    expect(rows).to_have_count(10)
    expect(page.get_by_role("link", name="Next →")).to_have_count(0)
