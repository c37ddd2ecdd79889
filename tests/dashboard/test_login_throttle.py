"""Dashboard sign-in is throttled by django-axes: per (username, address) pair, and per address for
any usernames at a higher limit, with a lockout page instead of an answer, until the cool-off ends.
Nobody can lock another person out from an address of their own (issue 40)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import F
from django.test import Client
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


def test_five_failures_for_owner_from_one_address_do_not_lock_owner_out_elsewhere(client, make_user):
    owner = make_user("owner")
    assert set(_guess(client, "owner", settings.AXES_FAILURE_LIMIT + 5)) <= {200, 429}
    assert _sign_in(client, "owner", PASSWORD, address=ATTACKER).status_code == 429

    response = _sign_in(client, "owner", PASSWORD, address=ELSEWHERE)

    assert response.status_code == 302
    assert _signed_in_as(client) == str(owner.pk)


def test_a_locked_pair_leaves_other_usernames_from_that_address_alone(client, make_user):
    make_user("alice")
    bob = make_user("bob")
    _guess(client, "alice", settings.AXES_FAILURE_LIMIT)

    response = _sign_in(client, bob.username, PASSWORD, address=ATTACKER)

    assert response.status_code == 302
    assert _signed_in_as(client) == str(bob.pk)


def _guess_many_names(client: Any, failures: int, address: str = ATTACKER, **extra: Any) -> list[int]:
    """``failures`` wrong passwords from one address, a few per username, never reaching a pair's limit."""
    per_name = settings.AXES_FAILURE_LIMIT - 1
    return [
        _sign_in(client, f"name-{n // per_name}", f"guess-{n}", address, **extra).status_code for n in range(failures)
    ]


def test_many_failures_from_one_address_for_many_names_lock_that_address(client, make_user):
    bob = make_user("bob")
    limit = settings.STROP_LOGIN_ADDRESS_FAILURE_LIMIT
    assert limit > settings.AXES_FAILURE_LIMIT

    statuses = _guess_many_names(client, limit + 3)

    assert statuses[: limit - 1] == [200] * (limit - 1)
    assert set(statuses[limit - 1 :]) == {429}
    assert _sign_in(client, bob.username, PASSWORD, address=ATTACKER).status_code == 429
    assert _signed_in_as(client) is None
    response = _sign_in(client, bob.username, PASSWORD, address=ELSEWHERE)
    assert response.status_code == 302 and _signed_in_as(client) == str(bob.pk)


def test_a_success_does_not_clear_the_failures_for_other_names_from_that_address(client, make_user):
    mallory = make_user("mallory")
    make_user("bob")
    limit = settings.STROP_LOGIN_ADDRESS_FAILURE_LIMIT
    _guess_many_names(client, limit - 1)
    assert _sign_in(client, mallory.username, PASSWORD).status_code == 302

    assert _sign_in(client, "someone-else", "guess").status_code == 429
    assert _sign_in(Client(), "bob", PASSWORD).status_code == 429


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
    _guess_many_names(
        client,
        settings.STROP_LOGIN_ADDRESS_FAILURE_LIMIT,
        address=proxy,
        HTTP_X_FORWARDED_FOR=f"{ELSEWHERE}, {ATTACKER}",
    )

    assert _sign_in(client, bob.username, PASSWORD, address=proxy, HTTP_X_FORWARDED_FOR=ATTACKER).status_code == 429
    response = _sign_in(client, bob.username, PASSWORD, address=proxy, HTTP_X_FORWARDED_FOR=ELSEWHERE)
    assert response.status_code == 302
    assert _signed_in_as(client) == str(bob.pk)
