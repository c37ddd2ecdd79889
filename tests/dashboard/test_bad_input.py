"""What a user can type or craft into the dashboard gets a 4xx or a form error saying what is
wrong: never a 500, and never a page or a download of more than was asked for."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from apps.cohorts.models import EndUser
from apps.common.exceptions import ValidationFailed
from apps.experiments.models import Experiment
from apps.tenants.models import AuditEvent
from apps.training.models import EvalSet, TrainingPolicy
from apps.training.overrides import overrides_checked
from tests.dashboard.conftest import PASSWORD
from tests.dashboard.routes import ACTIONS, url_for

pytestmark = pytest.mark.django_db

# A UTC value outside the years a datetime holds, once its offset is applied.
OUT_OF_RANGE = {"since": "9999-12-31T23:59:59-01:00", "until": "0001-01-01T00:00:00+01:00"}


def _error_beside(page: str, field: str) -> str:
    return page.split(f'id="id_{field}_error">', 1)[1].split("</p>", 1)[0]


# Bug 1: since / until whose UTC value is outside the years 1-9999.


@pytest.mark.parametrize("field", ["since", "until"])
def test_a_time_outside_the_years_in_utc_is_an_error_beside_its_field_on_the_list(login, world, field):
    response = login(world.users["viewer"]).get(url_for("interactions", world), {field: OUT_OF_RANGE[field]})

    assert response.status_code == 200
    assert "outside the years 1 to 9999" in _error_beside(response.content.decode(), field)
    assert response.context["page"].object_list == []


@pytest.mark.parametrize("field", ["since", "until"])
def test_a_time_outside_the_years_in_utc_is_a_400_naming_it_on_the_download(login, world, field):
    response = login(world.users["viewer"]).get(url_for("interactions-csv", world), {field: OUT_OF_RANGE[field]})

    assert response.status_code == 400
    assert f"{field}: This time is outside the years 1 to 9999" in response.content.decode()


# Bug 12: one invalid filter dropped every filter.


def test_a_download_with_one_invalid_filter_is_a_400_naming_it_not_everyones_rows(login, world):
    response = login(world.users["viewer"]).get(
        url_for("interactions-csv", world), {"user": "dev-2", "since": "yesterday"}
    )

    assert response.status_code == 400
    assert not response.get("Content-Disposition")
    body = response.content.decode()
    assert "since: Enter a valid date/time." in body and "user" not in body.split("\n", 1)[1]


def test_a_download_with_valid_filters_still_holds_only_their_rows(login, world):
    response = login(world.users["viewer"]).get(url_for("interactions-csv", world), {"user": "nobody"})

    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows == []


def test_the_list_with_one_invalid_filter_shows_its_error_and_no_rows(login, world):
    response = login(world.users["viewer"]).get(url_for("interactions", world), {"user": "dev-1", "since": "yesterday"})

    assert response.status_code == 200
    page = response.content.decode()
    assert "Enter a valid date/time." in _error_beside(page, "since")
    assert response.context["page"].object_list == []
    assert 'value="dev-1"' in page  # what was typed stays in the form, to be corrected
    assert "A filter is invalid" in page and "No interaction matches" not in page


# Bug 2: an `after` cursor whose offset Python reads and Postgres refuses.

ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def test_a_cursor_with_an_offset_postgres_refuses_is_read_in_utc(login, world):
    client = login(world.users["viewer"])
    response = client.get(url_for("interactions", world), {"after": f"2024-01-01T00:00:00+01:00:00.000001~{ZERO_UUID}"})

    assert response.status_code == 200
    assert response.context["page"].object_list == []  # every interaction of the world is newer
    assert response.context["page"].first is False


def test_a_cursor_outside_the_years_in_utc_gives_the_first_page_as_any_unreadable_cursor(login, world):
    client = login(world.users["viewer"])
    newest = client.get(url_for("interactions", world)).context["page"].object_list

    for moment in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        response = client.get(url_for("interactions", world), {"after": f"{moment}~{ZERO_UUID}"})
        assert response.status_code == 200
        assert response.context["page"].first is True
        assert response.context["page"].object_list == newest


# Bug 3: a NUL character in the end user id of the cohorts pages.


def test_an_end_user_id_with_a_nul_is_not_found_on_every_end_user_page(login, world):
    client = login(world.users["owner"])
    users_before = EndUser.objects.filter(tenant=world.a).count()
    named = {"end_user_id": "dev-1\x00b"}

    assert client.get(url_for("end-user", world), named).status_code == 404
    assert client.get(url_for("end-user-erase", world), named).status_code == 404
    assert client.post(url_for("end-user-erase", world), named).status_code == 404
    assert client.post(url_for("end-user-consent", world), {**named, "opted_in": "false"}).status_code == 404
    assert EndUser.objects.filter(tenant=world.a).count() == users_before
    assert EndUser.objects.get(tenant=world.a, external_id="dev-1").opted_in is True


# A NUL character in the reason of an action on an experiment (Postgres stores none).


@pytest.mark.parametrize("action", ["experiment-stop", "experiment-rollback", "experiment-promote"])
def test_a_reason_with_a_nul_is_an_error_beside_its_field_and_nothing_changes(login, world, action):
    audit_before = AuditEvent.objects.filter(tenant=world.a).count()

    response = login(world.users["admin"]).post(url_for(action, world), {"reason": "bad\x00reason"})

    assert response.status_code == 400
    assert "cannot hold a NUL character" in _error_beside(response.content.decode(), "reason")
    assert Experiment.objects.get(pk=world.experiment.pk).status == Experiment.Status.RUNNING
    assert AuditEvent.objects.filter(tenant=world.a).count() == audit_before


# One invalid filter on the cohorts page dropped every filter and listed everyone.


@pytest.mark.parametrize(
    ("query", "field", "problem"),
    [
        ({"q": "dev-1", "state": "maybe"}, "state", "Select a valid choice. maybe is not one"),
        ({"q": "d" * 201, "state": "in"}, "q", "Ensure this value has at most 200 characters"),
        ({"q": "dev\x001", "state": "in"}, "q", "Null characters are not allowed."),
    ],
)
def test_the_cohorts_list_with_one_invalid_filter_shows_its_error_and_nobody(login, world, query, field, problem):
    response = login(world.users["viewer"]).get(url_for("cohorts", world), query)

    assert response.status_code == 200
    page = response.content.decode()
    assert problem in _error_beside(page, field)
    assert response.context["page"].object_list == []
    assert "A filter is invalid" in page and "No end user matches" not in page
    assert ">Clear</a>" in page


# Bugs 4 and 5: eval-set cases pasted or uploaded with a lone surrogate or deep nesting.

SURROGATE_CASE = '{"prefix": "\\ud800", "suffix": "", "middle": "x"}'
DEEP = "[" * 3000 + "]" * 3000


@pytest.mark.parametrize(
    ("cases", "problem"),
    [
        (f"[{SURROGATE_CASE}]", "not valid JSON: no low surrogate in string at line 1"),
        (SURROGATE_CASE, "line 1: not valid JSON (no low surrogate in string)"),
        (DEEP, "not valid JSON: depth limit exceeded at line 1"),
        ('{"prefix": "a", "suffix": "b", "middle": "c"}\n{"prefix": ' + DEEP + "}", "line 2: not valid JSON"),
        ('[{"prefix": "a", "suffix": "b", "middle": NaN}]', "not valid JSON: NaN and Infinity are not JSON numbers"),
    ],
)
def test_pasted_cases_the_api_would_refuse_are_named_beside_the_field(login, world, cases, problem):
    response = login(world.users["admin"]).post(url_for("eval-set", world), {"cases": cases})

    assert response.status_code == 400
    assert problem in _error_beside(response.content.decode(), "cases")
    assert not EvalSet.objects.filter(adapter=world.adapter).exists()


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (SURROGATE_CASE.encode() + b"\n", "line 1: not valid JSON (no low surrogate in string)"),
        (f"[{SURROGATE_CASE}]".encode(), "not valid JSON: no low surrogate in string"),
        (DEEP.encode(), "not valid JSON: depth limit exceeded"),
    ],
)
def test_an_uploaded_file_the_api_would_refuse_is_named_beside_the_field(login, world, body, problem):
    upload = SimpleUploadedFile("cases.jsonl", body)
    response = login(world.users["admin"]).post(url_for("eval-set", world), {"file": upload})

    assert response.status_code == 400
    assert problem in _error_beside(response.content.decode(), "file")
    assert not EvalSet.objects.filter(adapter=world.adapter).exists()


# Bugs 6 and 7: the training policy's "Trainer settings" JSON.


def _policy_post(login: Any, world: Any, overrides: str) -> Any:
    data = {**ACTIONS["training-policy"][1], "trainer_overrides": overrides}
    return login(world.users["admin"]).post(url_for("training-policy", world), data)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ("[" * 3000 + "]" * 3000, "depth limit exceeded"),
        ('{"epochs": 1' + "0" * 5000 + "}", "number is infinity when parsed as double"),
        ('{"epochs": 1' + "0" * 400 + "}", "number is infinity when parsed as double"),
        ('{"\\ud800": 1}', "no low surrogate in string"),
        ('{"learning_rate": NaN}', "NaN and Infinity are not JSON numbers"),
    ],
)
def test_trainer_settings_the_api_would_refuse_are_named_beside_the_field_and_nothing_is_saved(
    login, world, overrides, problem
):
    before = TrainingPolicy.objects.filter(adapter=world.adapter).values().first()

    response = _policy_post(login, world, overrides)

    assert response.status_code == 400
    beside = _error_beside(response.content.decode(), "trainer_overrides")
    assert "Not valid JSON (" in beside and problem in beside
    assert TrainingPolicy.objects.filter(adapter=world.adapter).values().first() == before


def test_an_integer_setting_past_a_doubles_range_is_refused_with_its_range(login, world):
    response = _policy_post(login, world, '{"epochs": 1' + "0" * 30 + "}")

    assert response.status_code == 400
    beside = _error_beside(response.content.decode(), "trainer_overrides")
    assert "must be an integer from 1 to 4, not 1e+30" in beside


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_stored_integer_past_a_doubles_range_is_a_validation_error_not_an_overflow(digits):
    # A policy read back from the database (json.loads) can hold one; orjson never gives one.
    with pytest.raises(ValidationFailed) as refused:
        overrides_checked("trainer_overrides", {"epochs": 10**digits})

    assert refused.value.message.startswith("trainer_overrides.epochs: must be an integer from 1 to 4, not an integer")
    assert f"of about {digits + 1:,} digits" in refused.value.message


@pytest.mark.parametrize("value", [1e400, float("nan"), 10**400], ids=["1e400", "nan", "10**400"])
def test_a_float_setting_that_is_no_finite_number_in_range_is_a_validation_error(value):
    with pytest.raises(ValidationFailed, match="trainer_overrides.learning_rate: must be a number"):
        overrides_checked("trainer_overrides", {"learning_rate": value})


def test_an_unknown_key_with_a_lone_surrogate_is_quoted_so_a_page_can_show_it():
    with pytest.raises(ValidationFailed) as refused:
        overrides_checked("trainer_overrides", {"\ud800": 1})

    message = refused.value.message
    assert message.startswith("trainer_overrides.'\\ud800': not a setting a tenant may change")
    message.encode()  # would raise UnicodeEncodeError if the key were repeated raw


# Bug 9: X-Forwarded-For entries that are no address, behind a trusted proxy.

PROXY = "10.0.0.2"


@pytest.mark.parametrize(
    ("forwarded", "counted_as"),
    [
        ("garbage", PROXY),
        ("1.2.3.4:5678", "1.2.3.4"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("2001:DB8::1", "2001:db8::1"),
        ("[::1", PROXY),
    ],
)
def test_behind_a_proxy_a_forwarded_entry_that_is_no_address_counts_as_the_connections(
    client, make_user, settings, forwarded, counted_as
):
    from axes.models import AccessAttempt

    settings.STROP_TRUSTED_PROXY_HOPS = 1
    make_user("alice")

    response = client.post(
        reverse("dashboard:login"),
        {"username": "alice", "password": "wrong-" + PASSWORD},
        REMOTE_ADDR=PROXY,
        HTTP_X_FORWARDED_FOR=forwarded,
    )

    assert response.status_code == 200  # the form again, with its error
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == [counted_as]
