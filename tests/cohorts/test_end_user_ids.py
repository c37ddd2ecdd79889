"""Every end user id ingest accepts can be read, opted in or out and erased through the API; an id
the API cannot address ("/" in it, ".", "..", "import") is refused with a 400 wherever one enters."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from apps.cohorts.models import ConsentChange, EndUser
from apps.interactions.models import Feedback, Interaction

pytestmark = pytest.mark.django_db

UNADDRESSABLE = ["team/alice", "/", "alice/", ".", "..", "import"]
ODD_BUT_ADDRESSABLE = [
    "alice smith",
    "ünïcødé-用户-🙂",
    "100%",
    "%2F",
    "what?now",
    "#hash",
    "a+b&c=d",
    "...",
    "opt-in",
    "back\\slash",
    "semi;colon",
]


def user_path(end_user_id: str, suffix: str = "") -> str:
    return f"/v1/users/{quote(end_user_id, safe='')}{suffix}"


def assert_nothing_stored() -> None:
    assert not Interaction.objects.exists()
    assert not Feedback.objects.exists()
    assert not EndUser.objects.exists()
    assert not ConsentChange.objects.exists()


def error_message(response) -> str:
    return response.json()["error"]["message"]


@pytest.mark.parametrize("end_user_id", UNADDRESSABLE)
def test_an_unaddressable_id_is_a_400_when_logging_an_interaction(client_a, end_user_id):
    body = {"client_id": "c-1", "prompt": "p", "completion": "c", "end_user_id": end_user_id}
    response = client_a.post("/v1/interactions", body, format="json")
    assert response.status_code == 400 and error_message(response).startswith("end_user_id:")
    batch = client_a.post("/v1/interactions", {"items": [body]}, format="json").json()
    assert batch["results"][0]["status"] == "rejected"
    assert batch["results"][0]["error"]["field"] == "end_user_id"
    assert_nothing_stored()


@pytest.mark.parametrize("field", ["uniqueId", "userId"])
def test_an_unaddressable_id_is_a_400_in_an_editor_outcome(client_a, field):
    body = {"completionId": "e-1", "prompt": "p", "completion": "c", "accepted": True, field: "team/alice"}
    response = client_a.post("/v1/editor/autocomplete", body, format="json")
    assert response.status_code == 400 and error_message(response).startswith(f"{field}:")
    assert_nothing_stored()


def test_an_unaddressable_id_is_a_400_in_the_user_header_of_an_editor_outcome(client_a):
    body = {"completionId": "e-1", "prompt": "p", "completion": "c", "accepted": True}
    response = client_a.post("/v1/editor/autocomplete", body, format="json", HTTP_X_STROP_USER="team/alice")
    assert response.status_code == 400 and error_message(response).startswith("X-Strop-User:")
    assert_nothing_stored()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_an_unaddressable_id_is_a_400_when_serving(client_a, route):
    body = {"prompt": "def f():"} if route == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    in_body = client_a.post(route, {**body, "user": "team/alice"}, format="json")
    assert in_body.status_code == 400 and error_message(in_body).startswith("user:")
    in_header = client_a.post(route, body, format="json", HTTP_X_STROP_USER="..")
    assert in_header.status_code == 400 and error_message(in_header).startswith("X-Strop-User:")
    assert_nothing_stored()


@pytest.mark.parametrize("end_user_id", UNADDRESSABLE)
def test_an_unaddressable_id_is_refused_by_the_consent_import(client_a, end_user_id):
    items = [{"end_user_id": end_user_id, "opted_in": True}]
    body = client_a.post("/v1/users/import", {"items": items}, format="json").json()
    assert body["rejected"] == 1 and body["results"][0]["error"]["field"] == "end_user_id"
    csv = f"end_user_id,opted_in\n{end_user_id},true\n"
    body = client_a.post("/v1/users/import", csv, content_type="text/csv").json()
    assert body["rejected"] == 1
    assert_nothing_stored()


def test_import_is_not_a_user_that_can_be_opted_in(client_a):
    response = client_a.post("/v1/users/import/opt-in")
    assert response.status_code == 400 and "reserved" in error_message(response)
    assert_nothing_stored()


def test_an_unaddressable_id_is_a_400_when_asking_for_an_assignment(client_a):
    response = client_a.get(f"/v1/adapters/autocomplete/assignment?user={quote('team/alice', safe='')}")
    assert response.status_code == 400 and error_message(response).startswith("user:")
    assert_nothing_stored()


@pytest.mark.parametrize("end_user_id", ODD_BUT_ADDRESSABLE)
def test_an_odd_id_that_ingest_accepts_can_be_read_opted_out_and_erased(client_a, end_user_id):
    body = {"client_id": "c-1", "prompt": "p", "completion": "c", "end_user_id": end_user_id, "opted_in": True}
    assert client_a.post("/v1/interactions", body, format="json").status_code == 201

    read = client_a.get(user_path(end_user_id))
    assert read.status_code == 200
    assert (read.json()["end_user_id"], read.json()["opted_in"], read.json()["interactions"]) == (end_user_id, True, 1)

    opted_out = client_a.post(user_path(end_user_id, "/opt-out"))
    assert opted_out.status_code == 200 and opted_out.json()["opted_in"] is False
    opted_in = client_a.post(user_path(end_user_id, "/opt-in"))
    assert opted_in.status_code == 200 and opted_in.json()["opted_in"] is True

    erased = client_a.delete(user_path(end_user_id))
    assert erased.status_code == 200 and erased.json()["deleted"]["interactions"] == 1
    assert client_a.get(user_path(end_user_id)).status_code == 404
    assert not Interaction.objects.exists() and not EndUser.objects.exists()


def test_a_csv_import_past_the_body_limit_is_a_413_and_imports_nothing(client_a, settings):
    settings.STROP_MAX_BODY_BYTES = 200
    rows = "".join(f"user-{n},true\n" for n in range(40))  # about 440 bytes: the first rows would fit
    response = client_a.post("/v1/users/import", "end_user_id,opted_in\n" + rows, content_type="text/csv")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert response.json()["error"]["details"] == {"limit_bytes": 200}
    assert_nothing_stored()


def test_a_csv_import_within_the_body_limit_is_imported_whole(client_a, settings):
    settings.STROP_MAX_BODY_BYTES = 200
    rows = "".join(f"user-{n},true\n" for n in range(10))
    response = client_a.post("/v1/users/import", "end_user_id,opted_in\n" + rows, content_type="text/csv")
    assert response.status_code == 207 and response.json()["opted_in"] == 10
    assert EndUser.objects.filter(opted_in=True).count() == 10
