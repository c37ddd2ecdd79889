"""Dashboard sign-in is throttled by django-axes: per username (from any address) and per address
(for any username), with a lockout page instead of an answer, until the cool-off ends."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import F
from django.urls import reverse

from tests.dashboard.conftest import PASSWORD

pytestmark = pytest.mark.django_db

ATTACKER = "203.0.113.7"
ELSEWHERE = "198.51.100.20"


def _sign_in(client: Any, username: str, password: str, address: str = ATTACKER, **extra: Any) -> Any:
    return client.post(
        reverse("dashboard:login"), {"username": username, "password": password}, REMOTE_ADDR=address, **extra
    )


def _signed_in_as(client: Any) -> str | None:
    return client.session.get("_auth_user_id")


def _guess(client: Any, username: str, times: int, address: str = ATTACKER, **extra: Any) -> list[int]:
    return [_sign_in(client, username, f"guess-{n}", address, **extra).status_code for n in range(times)]


def test_thirty_wrong_passwords_then_the_right_one_does_not_sign_in(client, make_user):
    make_user("alice")
    limit = settings.AXES_FAILURE_LIMIT

    statuses = _guess(client, "alice", 30)

    # Refused with the form until the limit; from the limit on, the lockout page answers instead.
    assert statuses[: limit - 1] == [200] * (limit - 1)
    assert set(statuses[limit - 1 :]) == {429}
    response = _sign_in(client, "alice", PASSWORD)
    assert response.status_code == 429
    assert _signed_in_as(client) is None
    page = response.content.decode()
    assert "Too many sign-in attempts" in page and f"after {limit} failed attempts" in page
    assert client.get(reverse("dashboard:home")).status_code == 302  # still sent to the login page


def test_a_locked_username_is_refused_from_every_address(client, make_user):
    make_user("alice")
    _guess(client, "alice", settings.AXES_FAILURE_LIMIT)

    assert _sign_in(client, "alice", PASSWORD, address=ELSEWHERE).status_code == 429
    assert _signed_in_as(client) is None


def test_a_locked_address_is_refused_for_every_username(client, make_user):
    make_user("alice")
    bob = make_user("bob")
    _guess(client, "alice", settings.AXES_FAILURE_LIMIT)

    assert _sign_in(client, bob.username, PASSWORD, address=ATTACKER).status_code == 429
    assert _signed_in_as(client) is None


def test_another_user_from_another_address_signs_in_while_one_is_locked(client, make_user):
    make_user("alice")
    bob = make_user("bob")
    _guess(client, "alice", 30)

    response = _sign_in(client, bob.username, PASSWORD, address=ELSEWHERE)

    assert response.status_code == 302
    assert _signed_in_as(client) == str(bob.pk)


def test_failures_below_the_limit_do_not_stop_the_right_password(client, make_user):
    alice = make_user("alice")
    _guess(client, "alice", settings.AXES_FAILURE_LIMIT - 1)

    assert _sign_in(client, "alice", PASSWORD).status_code == 302
    assert _signed_in_as(client) == str(alice.pk)


def test_the_right_password_signs_in_again_once_the_cool_off_has_passed(client, make_user):
    alice = make_user("alice")
    _guess(client, "alice", settings.AXES_FAILURE_LIMIT)
    assert _sign_in(client, "alice", PASSWORD).status_code == 429

    AccessAttempt.objects.update(attempt_time=F("attempt_time") - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))

    assert _sign_in(client, "alice", PASSWORD).status_code == 302
    assert _signed_in_as(client) == str(alice.pk)


def test_behind_a_proxy_each_client_address_counts_on_its_own(client, make_user, settings):
    """Every request arrives from the proxy; the address it appended to X-Forwarded-For is the client's,
    and whatever a client put further left is not believed."""
    settings.STROP_TRUSTED_PROXY_HOPS = 1
    bob = make_user("bob")
    proxy = "10.0.0.2"
    # The attacker claims someone else's address in its own X-Forwarded-For; the proxy appends its real one.
    _guess(client, "mallory", 30, address=proxy, HTTP_X_FORWARDED_FOR=f"{ELSEWHERE}, {ATTACKER}")

    assert _sign_in(client, bob.username, PASSWORD, address=proxy, HTTP_X_FORWARDED_FOR=ATTACKER).status_code == 429
    response = _sign_in(client, bob.username, PASSWORD, address=proxy, HTTP_X_FORWARDED_FOR=ELSEWHERE)
    assert response.status_code == 302
    assert _signed_in_as(client) == str(bob.pk)
