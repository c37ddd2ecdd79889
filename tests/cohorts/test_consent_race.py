"""An admin's or the API's consent change made while a request recording the same end user is still
open: the change waits for that request and is applied to what it committed, never lost to it."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from apps.cohorts.models import ConsentChange, EndUser
from apps.cohorts.services import end_user_consent_set, end_users_observe

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_opt_out_made_while_a_request_opts_the_user_in_is_the_change_that_stands(tenant):
    EndUser.objects.create(tenant=tenant, external_id="u", opted_in=False)
    observed, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def request_opting_in() -> None:
        try:
            with transaction.atomic():
                end_users_observe(tenant, observations=[("u", True)], source="request", actor="key", default=False)
                observed.set()
                release.wait(10)  # the rest of a batch being written
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    def admin_opting_out() -> None:
        try:
            end_user_consent_set(tenant, external_id="u", opted_in=False, source="admin", actor="admin@x")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    ingest = threading.Thread(target=request_opting_in)
    ingest.start()
    assert observed.wait(10)
    admin = threading.Thread(target=admin_opting_out)
    admin.start()
    admin.join(0.5)
    assert admin.is_alive()  # waits for the request's transaction, instead of reading past it
    release.set()
    ingest.join(10)
    admin.join(10)
    assert not errors, errors
    user = EndUser.objects.get(tenant=tenant, external_id="u")
    assert user.opted_in is False
    history = list(ConsentChange.objects.filter(end_user=user).order_by("id").values_list("opted_in", "source"))
    assert history == [(True, "request"), (False, "admin")]
