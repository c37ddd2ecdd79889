"""Access logs keep no secret from a URL and no end-user id (an erase removes the id from every
table; the logs must not keep it either): paths are logged by route, those values as placeholders."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from apps.common.observability.logs import JsonFormatter
from apps.interactions.services import interactions_ingest

pytestmark = pytest.mark.django_db

END_USER = "jane.doe@example.com"
INVITE_TOKEN = "invite-Zk3qR8xV1wYp0tLs9NcE"
RESET_TOKEN = "c4v1x2-0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5"


@pytest.fixture
def log_text() -> Iterator[io.StringIO]:
    """Everything the configured console handler writes during the test (JSON lines)."""
    handler = next(h for h in logging.getLogger().handlers if h.name == "console")
    assert isinstance(handler.formatter, JsonFormatter)
    stream = io.StringIO()
    previous = handler.setStream(stream)
    try:
        yield stream
    finally:
        handler.setStream(previous)


def access_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if '"strop.request"' in line]


def test_end_user_routes_log_a_placeholder_never_the_id(client_a, tenant, log_text):
    interactions_ingest(tenant, items=[{"prompt": "p", "completion": "c", "end_user_id": END_USER}])
    assert client_a.post(f"/v1/users/{END_USER}/opt-in").status_code == 200
    assert client_a.get(f"/v1/users/{END_USER}").status_code == 200
    assert client_a.delete(f"/v1/users/{END_USER}").status_code == 200
    assert client_a.get(f"/v1/users/{END_USER}").status_code == 404

    lines = access_lines(log_text.getvalue())
    assert len(lines) == 4
    assert END_USER not in log_text.getvalue() and "jane.doe" not in log_text.getvalue()
    assert '"message":"POST /v1/users/{end_user_id}/opt-in 200' in lines[0]
    assert '"message":"GET /v1/users/{end_user_id} 200' in lines[1]


def test_invitation_and_password_reset_links_log_no_token(log_text):
    user = get_user_model().objects.create_user("viewer", "viewer@example.com", "a long and unusual passphrase")
    uidb64 = urlsafe_base64_encode(force_bytes(user.pk))
    browser = Client()
    browser.get(f"/dashboard/invite/{INVITE_TOKEN}/")
    browser.get(f"/dashboard/password/reset/{uidb64}/{RESET_TOKEN}/")

    text = log_text.getvalue()
    lines = access_lines(text)
    assert len(lines) == 2
    assert INVITE_TOKEN not in text and RESET_TOKEN not in text and f"/{uidb64}/" not in text
    assert '"message":"GET /dashboard/invite/{token}/' in lines[0]
    assert '"message":"GET /dashboard/password/reset/{uidb64}/{token}/' in lines[1]


def test_a_path_no_route_matches_keeps_only_its_first_segments(client_a, log_text):
    assert client_a.get(f"/v1/users/{END_USER}/no-such-action/x").status_code == 404
    [line] = access_lines(log_text.getvalue())
    assert END_USER not in log_text.getvalue() and '"message":"GET /v1/users/… 404' in line


def test_other_parameters_are_logged_as_sent(client_a, log_text):
    client_a.get("/v1/adapters/tab/versions")
    [line] = access_lines(log_text.getvalue())
    assert '"message":"GET /v1/adapters/tab/versions 404' in line


def test_a_server_error_log_line_names_the_route_not_the_end_user(log_text, rf):
    """Django's own "Internal Server Error: <path>" line (logger django.request) is redacted too."""
    from django.urls import resolve
    from django.utils.log import log_response

    request = rf.get(f"/v1/users/{END_USER}")
    request.resolver_match = resolve(request.path)
    from django.http import HttpResponseServerError

    log_response("Internal Server Error: %s", request.path, response=HttpResponseServerError(), request=request)
    text = log_text.getvalue()
    assert "Internal Server Error: /v1/users/{end_user_id}" in text and END_USER not in text
