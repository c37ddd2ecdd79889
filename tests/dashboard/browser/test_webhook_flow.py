"""An owner adds a webhook, copies its signing secret (shown once), sees a delivery in the log
after a training run fails, rotates the secret (the new one shown once), and deletes the webhook
through its confirmation page."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from apps.notifications.models import Webhook
from apps.tenants.models import AuditEvent
from tests.dashboard.browser.conftest import sign_in, tour_page

pytestmark = pytest.mark.slow


def test_add_a_webhook_see_its_delivery_and_delete_it(page, live_world):
    from apps.training.models import TrainingRun
    from apps.training.services import training_run_advance

    world = live_world
    sign_in(page, world.users["owner"])
    page.get_by_role("navigation", name=f"Sections of {world.a.name}").get_by_role("link", name="Webhooks").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Webhooks")
    page.get_by_label("Endpoint URL").fill("notaurl")
    page.get_by_role("button", name="Add webhook").click()
    expect(page.locator(".field__error").first).to_contain_text("must be an http(s) URL")
    page.get_by_label("Endpoint URL").fill("https://hooks.example.com/strop")
    page.get_by_role("button", name="Add webhook").click()
    expect(page.get_by_role("heading", name="Webhook created: copy its signing secret now")).to_be_visible()
    webhook = Webhook.objects.get(tenant=world.a)
    assert page.get_by_role("textbox", name="Signing secret").input_value() == webhook.secret
    tour_page(page, "webhook-created")

    # A run fails: its delivery is in the log (no worker runs here, so it waits, pending).
    run = TrainingRun.objects.create(tenant=world.a, adapter=world.adapter, status=TrainingRun.Status.TRAINING)
    assert training_run_advance(run, status=TrainingRun.Status.FAILED, error="RuntimeError: out of memory")
    page.goto(page.url)  # a GET: reloading would send the form again
    assert webhook.secret not in page.content()  # shown once
    log = page.get_by_role("region", name="Webhook deliveries")
    expect(log.get_by_role("row").nth(1)).to_contain_text("run.failed")
    expect(log.get_by_role("row").nth(1)).to_contain_text("pending")
    tour_page(page, "webhooks-with-delivery")

    # The secret rotates: the new one is shown once; the old one still signs for the overlap.
    page.get_by_role("link", name="Rotate secret… of webhook https://hooks.example.com/strop").click()
    page.get_by_role("button", name="Rotate secret").click()
    expect(page.get_by_role("heading", name="Secret rotated: copy the new signing secret now")).to_be_visible()
    webhook.refresh_from_db()
    assert page.get_by_role("textbox", name="Signing secret").input_value() == webhook.secret
    assert webhook.previous_secret and webhook.previous_secret != webhook.secret
    tour_page(page, "webhook-rotated")
    page.get_by_role("link", name="Back to webhooks").click()

    page.get_by_role("link", name="Delete… webhook https://hooks.example.com/strop").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Delete the webhook")
    page.get_by_role("button", name="Delete webhook").click()
    expect(page.get_by_text("Webhook https://hooks.example.com/strop is deleted")).to_be_visible()
    assert not Webhook.objects.filter(tenant=world.a).exists()
    assert AuditEvent.objects.filter(tenant=world.a, action="webhook.delete").exists()
