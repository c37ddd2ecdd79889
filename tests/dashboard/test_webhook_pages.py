"""The Webhooks page through the real sign-in: a viewer sees each endpoint's host only (a URL often
carries a token), on the page, in the delivery log and in the audit log; an admin sees the full URL
and rotates the signing secret, which is shown once."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.notifications.models import Webhook
from apps.notifications.services import notification_send, webhook_create
from apps.tenants.models import AuditEvent
from tests.dashboard.conftest import PASSWORD

TOKEN = "t0k3n-5f9c2e"
URL = f"https://hooks.example.com/strop/{TOKEN}?key={TOKEN}"


def _signed_in(client, user):
    response = client.post("/dashboard/login/", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302, response.content.decode()[:500]
    return client


@pytest.fixture
def hooked(make_tenant, make_user):
    tenant = make_tenant("hooks-pages")
    webhook = webhook_create(tenant, url=URL, events=["run.failed"], actor="user:0")
    notification_send(tenant, event="run.failed", data={"run": 1})  # a row in the delivery log
    return tenant, webhook


@pytest.mark.django_db
def test_a_viewer_sees_the_host_of_each_webhook_never_its_url(client, hooked, make_user):
    tenant, _ = hooked
    _signed_in(client, make_user("vera", tenant, role="viewer"))

    for page in (f"/dashboard/t/{tenant.slug}/webhooks/", f"/dashboard/t/{tenant.slug}/audit/"):
        html = client.get(page).content.decode()
        assert TOKEN not in html, page
    html = client.get(f"/dashboard/t/{tenant.slug}/webhooks/").content.decode()
    assert html.count("hooks.example.com") >= 2  # the endpoint and its delivery, by host
    assert "Rotate secret" not in html


@pytest.mark.django_db
def test_an_admin_sees_the_full_url(client, hooked, make_user):
    tenant, _ = hooked
    _signed_in(client, make_user("ada", tenant, role="admin"))
    html = client.get(f"/dashboard/t/{tenant.slug}/webhooks/").content.decode()
    assert f"/strop/{TOKEN}" in html


@pytest.mark.django_db
def test_an_admin_rotates_the_secret_and_sees_the_new_one_once(client, hooked, make_user):
    tenant, webhook = hooked
    old_secret = webhook.secret
    _signed_in(client, make_user("ada", tenant, role="admin"))
    rotate = f"/dashboard/t/{tenant.slug}/webhooks/{webhook.pk}/rotate/"

    confirm = client.get(rotate)
    assert confirm.status_code == 200 and "24 hours" in confirm.content.decode()
    response = client.post(rotate, follow=True)

    assert response.redirect_chain == [(rotate, 302)] and response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    webhook.refresh_from_db()
    assert webhook.secret != old_secret and webhook.previous_secret == old_secret
    html = response.content.decode()
    assert webhook.secret in html and old_secret not in html
    assert webhook.secret not in client.get(f"/dashboard/t/{tenant.slug}/webhooks/").content.decode()
    assert AuditEvent.objects.filter(tenant=tenant, action="webhook.secret_rotate", actor__startswith="user:").exists()


@pytest.mark.django_db
def test_a_viewer_cannot_rotate_a_secret(client, hooked, make_user):
    tenant, webhook = hooked
    _signed_in(client, make_user("vera", tenant, role="viewer"))
    assert client.post(f"/dashboard/t/{tenant.slug}/webhooks/{webhook.pk}/rotate/").status_code == 403
    assert Webhook.objects.get(pk=webhook.pk).secret == webhook.secret


@pytest.mark.django_db
def test_a_webhook_whose_secret_no_key_opens_still_lists_and_its_rotation_says_only_the_new_one_signs(
    client, hooked, make_user, settings
):
    import secrets

    tenant, webhook = hooked
    settings.STORED_SECRETS_KEY, settings.STORED_SECRETS_KEY_FALLBACKS = secrets.token_urlsafe(50), []
    _signed_in(client, make_user("ada", tenant, role="admin"))

    listed = client.get(f"/dashboard/t/{tenant.slug}/webhooks/")
    assert listed.status_code == 200 and "hooks.example.com" in listed.content.decode()
    response = client.post(f"/dashboard/t/{tenant.slug}/webhooks/{webhook.pk}/rotate/", follow=True)

    assert response.status_code == 200
    html = response.content.decode()
    assert "The old secret could not be read" in html and "two signatures" not in html
    assert Webhook.objects.get(pk=webhook.pk).secret in html


def _admin(client, tenant, make_user):
    return _signed_in(client, make_user("ada", tenant, role="admin"))


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["https://[abc/hook", "https://a]b/", "https://exa\uff0fmple.com/"])
def test_a_url_python_cannot_split_is_an_error_beside_the_field(client, make_tenant, make_user, url):
    tenant = make_tenant("hooks-malformed-page")
    _admin(client, tenant, make_user)
    response = client.post(f"/dashboard/t/{tenant.slug}/webhooks/", {"url": url, "events": ["run.failed"]})
    assert response.status_code == 400
    assert response.context["form"].errors["url"]
    assert not Webhook.objects.filter(tenant=tenant).exists()


@pytest.mark.django_db
def test_adding_a_webhook_shows_its_secret_once_and_a_refresh_adds_no_second_endpoint(client, make_tenant, make_user):
    tenant = make_tenant("hooks-add-twice")
    _admin(client, tenant, make_user)
    page = f"/dashboard/t/{tenant.slug}/webhooks/"
    data = {"url": "https://hooks.example.com/strop", "events": ["run.failed"]}

    response = client.post(page, data, follow=True)  # Post/Redirect/Get: the secret on the page it leads to

    webhook = Webhook.objects.get(tenant=tenant)
    assert response.redirect_chain and response.status_code == 200
    assert response["Cache-Control"] == "no-store" and webhook.secret in response.content.decode()
    assert webhook.secret not in client.get(page).content.decode()  # shown once

    again = client.post(page, data)  # the form sent again (a resubmission, or the same URL typed anew)
    assert again.status_code == 400
    assert "already" in " ".join(again.context["form"].errors["url"])
    assert Webhook.objects.filter(tenant=tenant).count() == 1
    assert AuditEvent.objects.filter(tenant=tenant, action="webhook.create").count() == 1


@pytest.mark.django_db
def test_a_refreshed_rotation_rotates_nothing_and_a_repeat_keeps_the_receivers_secret(client, hooked, make_user):
    tenant, webhook = hooked
    receivers_secret = webhook.secret
    _admin(client, tenant, make_user)
    rotate = f"/dashboard/t/{tenant.slug}/webhooks/{webhook.pk}/rotate/"

    response = client.post(rotate)
    assert response.status_code == 302 and response["Location"] == rotate
    shown = client.get(rotate)  # where the POST led: the new secret, once
    webhook.refresh_from_db()
    first_new = webhook.secret
    assert shown["Cache-Control"] == "no-store" and first_new in shown.content.decode()

    refreshed = client.get(rotate)  # a browser refresh repeats the GET, never the POST
    assert first_new not in refreshed.content.decode() and "Rotate secret" in refreshed.content.decode()
    webhook.refresh_from_db()
    assert webhook.secret == first_new

    # The form sent again at once (a double click, or back and resubmit): a new secret replaces the one
    # no receiver can have taken yet, and the receiver's own secret keeps signing beside it. (Dated
    # now, so a slow machine between the two requests does not leave the repeat window.)
    Webhook.objects.filter(pk=webhook.pk).update(secret_rotated_at=timezone.now())
    client.post(rotate)
    webhook.refresh_from_db()
    assert webhook.secret not in (first_new, receivers_secret)
    assert webhook.previous_secret == receivers_secret
    assert webhook.secret in client.get(rotate).content.decode()
    assert AuditEvent.objects.filter(tenant=tenant, action="webhook.secret_rotate").count() == 2
