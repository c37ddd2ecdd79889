"""An owner invites a teammate, who opens the link in a browser of their own, creates an account and
lands in the tenant."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.tenants.models import AuditEvent, Invitation, Membership
from tests.dashboard.browser.conftest import SCREENSHOTS, TIMEOUT_MS, VIEWPORTS, sign_in, tour_page

pytestmark = pytest.mark.slow

# Written with the other artifacts; docs/screenshots/team.png is a copy of it made by hand.
TEAM_SCREENSHOT = SCREENSHOTS / "team-flow.png"


def test_invite_a_teammate_who_creates_an_account_and_sees_the_tenant(page, browser, live_server, live_world):
    world = live_world
    sign_in(page, world.users["owner"])
    page.get_by_role("navigation", name=f"Sections of {world.a.name}").get_by_role("link", name="Team").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Team")
    page.get_by_role("link", name="Invite a teammate…").click()
    page.get_by_label("Role").select_option("admin")
    page.get_by_label("Email or name").fill("dana@example.com")
    page.get_by_role("button", name="Create invitation link").click()
    expect(page.get_by_role("heading", name="Invitation created: copy the link now")).to_be_visible()
    link = page.get_by_label("Invitation link").input_value()
    assert link.startswith(f"{live_server.url}/dashboard/invite/")
    tour_page(page, "team-invitation-created")

    page.get_by_role("link", name="Back to the team").click()
    pending = page.get_by_role("region", name="Pending invitations")
    expect(pending.get_by_role("row", name="dana@example.com")).to_contain_text("admin")
    assert link not in page.content()  # shown once
    tour_page(page, "team")
    TEAM_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(TEAM_SCREENSHOT), full_page=True)

    # The teammate: a browser of their own, signed in as nobody.
    context = browser.new_context(viewport=VIEWPORTS["desktop"], base_url=live_server.url)
    context.set_default_timeout(TIMEOUT_MS)
    try:
        newcomer = context.new_page()
        newcomer.goto(link)
        expect(newcomer.get_by_role("heading", level=1)).to_have_text(f"Join {world.a.name}")
        expect(newcomer.get_by_label("Email address")).to_have_value("dana@example.com")
        tour_page(newcomer, "team-accept")
        newcomer.get_by_label("Username").fill("dana")
        newcomer.get_by_label("Password", exact=True).fill("too-short")
        newcomer.get_by_label("Password confirmation").fill("too-short")
        newcomer.get_by_role("button", name="Create account and join").click()
        # Why the password is refused, under the password itself; nothing under its confirmation.
        password_field = newcomer.locator(".field", has=newcomer.get_by_label("Password", exact=True))
        expect(password_field.locator(".field__error")).to_contain_text("too short")
        confirmation = newcomer.locator(".field", has=newcomer.get_by_label("Password confirmation"))
        expect(confirmation.locator(".field__error")).to_have_count(0)
        tour_page(newcomer, "team-accept-errors")
        newcomer.get_by_label("Password", exact=True).fill("a-long-and-fresh-passphrase-42")
        newcomer.get_by_label("Password confirmation").fill("a-long-and-fresh-passphrase-42")
        newcomer.get_by_role("button", name="Create account and join").click()
        expect(newcomer.get_by_text(f"Welcome to {world.a.name}: you are admin.")).to_be_visible()
        expect(newcomer).to_have_url(f"{live_server.url}/dashboard/t/{world.a.slug}/")
        expect(newcomer.locator(".topbar .badge--role")).to_have_text("admin")
        newcomer.get_by_role("navigation", name=f"Sections of {world.a.name}").get_by_role("link", name="Team").click()
        expect(newcomer.locator('tr[data-member="dana"]')).to_contain_text("(you)")

        used = newcomer.goto(link)
        assert used is not None and used.status == 410
        expect(newcomer.get_by_role("heading", level=1)).to_have_text("This invitation can no longer be used")
    finally:
        context.close()

    dana = Membership.objects.select_related("user").get(tenant=world.a, user__username="dana")
    assert dana.role == "admin"
    assert Invitation.objects.get(tenant=world.a, note="dana@example.com").used_by_id == dana.user_id
    assert AuditEvent.objects.filter(tenant=world.a, action="invitation.accept", actor=f"user:{dana.user_id}").exists()
