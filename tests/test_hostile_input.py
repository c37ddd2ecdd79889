"""Hostile input, class by class: each is a clear 4xx naming what is wrong, nothing half-stored."""

from __future__ import annotations

import json

import httpx
import pytest

from apps.interactions.models import Feedback, Interaction
from apps.tenants.models import ApiKey

pytestmark = pytest.mark.django_db


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def item(client_id: str, **extra):
    return {"client_id": client_id, "prompt": "x = ", "completion": "1", **extra}


@pytest.mark.parametrize("depth", [33, 900, 1000])
def test_deeply_nested_metadata_is_one_rejected_item_and_the_good_items_are_stored(client_a, depth):
    deep = '{"a": ' * depth + "{}" + "}" * depth  # written by hand: encoders stop short of this depth
    body = (
        '{"items": [' + json.dumps(item("good-1")) + ', {"client_id": "deep", "prompt": "p", "completion": "c", '
        '"metadata": ' + deep + "}, " + json.dumps(item("good-2")) + "]}"
    )
    response = client_a.post("/v1/interactions", body, content_type="application/json")
    assert response.status_code == 207
    body = response.json()
    assert (body["created"], body["rejected"]) == (2, 1)
    assert "nested deeper than 32" in body["results"][1]["error"]["message"]
    assert set(Interaction.objects.values_list("client_id", flat=True)) == {"good-1", "good-2"}


def test_json_deeper_than_the_parser_takes_is_a_400(client_a):
    body = '{"client_id": "x", "prompt": "p", "completion": "c", "metadata": ' + '{"a": ' * 2000 + "1" + "}" * 2001
    response = client_a.post("/v1/interactions", body, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "malformed_json"


@pytest.mark.parametrize("stamp", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:30:00-01:00"])
def test_timestamps_out_of_range_once_in_utc_are_400(client_a, stamp):
    response = client_a.post("/v1/interactions", item("t", served_at=stamp), format="json")
    assert response.status_code == 400 and response.json()["error"]["message"].startswith("served_at")
    response = client_a.post(
        "/v1/feedback", {"client_id": "t", "outcome": "accepted", "occurred_at": stamp}, format="json"
    )
    assert response.status_code == 400 and response.json()["error"]["message"].startswith("occurred_at")
    assert not Interaction.objects.exists() and not Feedback.objects.exists()


@pytest.mark.parametrize("stamp", [10**19, -(10**18), 2**63 - 1])
def test_numeric_editor_timestamps_that_overflow_are_400(client_a, stamp):
    outcome = {"completionId": "e-1", "prompt": "p", "completion": "c", "accepted": True, "timestamp": stamp}
    response = client_a.post("/v1/editor/autocomplete", outcome, format="json")
    assert response.status_code == 400 and "timestamp" in response.json()["error"]["message"]
    assert not Interaction.objects.exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_new_events", -1),
        ("min_new_events", 2**63),
        ("max_wait_s", -5),
        ("max_wait_s", 2**40),
        ("reward_accepted", 1e300),
        ("heldout_fraction", -0.1),
        ("trainer_overrides", {"learning_rate": _nested(40)}),
    ],
)
def test_training_policy_values_out_of_range_are_400(client_a, field, value):
    from apps.adapters.models import Adapter, BaseModel

    base = BaseModel.objects.create(name="hostile-base", path="/nonexistent", family="qwen")
    Adapter.objects.create(tenant=client_a.tenant, name="tab", base_model=base)
    response = client_a.patch("/v1/adapters/tab/training-policy", {field: value}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"].startswith(field)


def test_unknown_fields_on_key_creation_are_400(client_a):
    before = ApiKey.objects.count()
    response = client_a.post("/v1/keys", {"name": "ci", "scopes": ["ingest"], "expires": "never"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["message"].startswith("expires")
    assert ApiKey.objects.count() == before


@pytest.mark.parametrize("spelling", ["%20{id}", "0_{id}", "{id}%20", "+{id}", "{full}", "0{id}"])
def test_an_id_reaches_its_object_only_by_its_one_spelling(client_a, spelling):
    key = ApiKey.objects.filter(tenant=client_a.tenant).first()
    full = "".join(chr(0xFF10 + int(d)) for d in str(key.pk))  # full-width digits
    path = spelling.replace("{id}", str(key.pk)).replace("{full}", full)
    assert client_a.get(f"/v1/keys/{path}").status_code == 404
    assert client_a.get(f"/v1/keys/{key.pk}").status_code == 200


@pytest.mark.parametrize("query", ["limit=abc", "limit=0", "limit=501", "offset=-1", "limt=5", "limit=1_0"])
def test_bad_query_parameters_are_400_naming_them(client_a, query):
    response = client_a.get(f"/v1/interactions?{query}")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"].startswith(query.split("=")[0])


def test_unknown_api_paths_answer_the_json_error_shape(client_a):
    for path in ("/v1/nothing-here", "/v1/interactions/x/y", "/v1"):
        response = client_a.get(path)
        assert response.status_code == 404 and response["Content-Type"].startswith("application/json")
        assert response.json()["error"]["code"] == "not_found"
    response = client_a.put("/v1/interactions", {}, format="json")
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.django_db(transaction=True)
def test_a_chunked_body_is_refused_with_411_by_a_server_that_cannot_read_it(live_server, client_a):
    def body():
        yield json.dumps(item("chunked-1")).encode()

    headers = {"Authorization": f"Bearer {client_a.raw_key}", "Content-Type": "application/json"}
    response = httpx.post(f"{live_server.url}/v1/interactions", content=body(), headers=headers, timeout=30)
    assert response.status_code == 411 and response.json()["error"]["code"] == "length_required"
    assert not Interaction.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_chunked_body_is_read_whole_under_gunicorn(client_a, tmp_path):
    import subprocess
    import sys

    from benchmarks.common import free_port, stop, wait_healthy
    from tests.fixtures.workers import REPO_ROOT, _database_url

    port = free_port()
    env = {**__import__("os").environ, "DATABASE_URL": _database_url(), "LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1"],
        cwd=REPO_ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, 60, "gunicorn")

        def body():
            text = json.dumps({"items": [item(f"chunked-{i}") for i in range(50)]}).encode()
            for start in range(0, len(text), 100):
                yield text[start : start + 100]

        headers = {"Authorization": f"Bearer {client_a.raw_key}", "Content-Type": "application/json"}
        response = httpx.post(f"http://127.0.0.1:{port}/v1/interactions", content=body(), headers=headers, timeout=30)
        assert response.status_code == 207 and response.json()["created"] == 50
        assert Interaction.objects.filter(client_id__startswith="chunked-").count() == 50
    finally:
        stop(proc)
