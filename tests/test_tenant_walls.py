"""Tenant B's key against tenant A's objects, on every endpoint.

The walk is driven by the URL configuration: an endpoint added without a row here fails
``test_every_endpoint_is_walked``, so no endpoint escapes this check.
"""

from __future__ import annotations

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.common.parsing import cursor_encode
from apps.interactions.models import Feedback, Interaction, PersistenceReport
from apps.tenants.models import ApiKey

pytestmark = pytest.mark.django_db

# Routes that hold no tenant data at all.
PUBLIC = {"health", "health-ready", "schema", "api-docs"}
# Routes for operators, behind their own guard (tests/test_observability.py): never a tenant key.
OPERATOR = {"metrics"}
# Routes that only read or write the caller's own tenant and take no object id: B sees only B.
OWN_TENANT_ONLY = {
    "adapters",
    "tenant-me",
    "api-keys",
    "audit-events",
    "interactions",
    "feedback",
    "feedback-persistence",
    "editor-autocomplete",
    "models",
    "end-users",
    "end-users-import",
}
# Routes that take an object id (or name): walked below with A's ids.
WITH_IDS = {
    "training-policy",
    "eval-set",
    "training-runs",
    "adapter-retrain",
    "training-run-detail",
    "training-run-exclude-window",
    "interaction-detail",
    "interaction-persistence",
    "api-key-detail",
    "completions",
    "chat-completions",
    "adapter-versions",
    "adapter-version-detail",
    "adapter-version-promote",
    "adapter-version-purge",
    "end-user-detail",
    "end-user-opt-in",
    "end-user-opt-out",
    "experiments",
    "assignment",
    "adapter-rollback",
    "adapter-holdout",
    "experiment-detail",
    "experiment-snapshots",
    "experiment-start",
    "experiment-stop",
    "experiment-promote",
    "experiment-rollback",
    "experiment-snapshot",
}


def _route_names(patterns, prefix: str = "") -> set[str]:
    names: set[str] = set()
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            # The dashboard's pages have their own walk, driven by the same resolver:
            # tests/dashboard/test_walls.py (a member of tenant B gets 404 on every page of A).
            if "admin" not in str(pattern.pattern) and pattern.namespace != "dashboard":
                names |= _route_names(pattern.url_patterns)
        elif isinstance(pattern, URLPattern) and pattern.name:
            names.add(pattern.name)
    return names


def test_every_endpoint_is_walked():
    assert _route_names(get_resolver().url_patterns) == PUBLIC | OPERATOR | OWN_TENANT_ONLY | WITH_IDS


@pytest.fixture
def world(make_tenant, make_client):
    a = make_client(make_tenant("tenant-a"))
    b = make_client(make_tenant("tenant-b"))
    interaction_id = a.post(
        "/v1/interactions", {"client_id": "secret-1", "prompt": "A's code", "completion": "A's text"}, format="json"
    ).json()["id"]
    a.post("/v1/feedback", {"interaction_id": interaction_id, "outcome": "accepted"}, format="json")
    a_key = ApiKey.objects.filter(tenant=a.tenant).first()
    return a, b, interaction_id, a_key


def test_b_cannot_read_a_interaction(world):
    _, b, interaction_id, _ = world
    for path in (f"/v1/interactions/{interaction_id}", f"/v1/interactions/{interaction_id}/persistence"):
        response = b.get(path)
        assert response.status_code == 404, path
        assert "A's" not in response.content.decode()


def test_b_cannot_see_a_key_or_revoke_it(world):
    _, b, _, a_key = world
    assert b.get(f"/v1/keys/{a_key.pk}").status_code == 404
    assert b.delete(f"/v1/keys/{a_key.pk}").status_code == 404
    a_key.refresh_from_db()
    assert a_key.revoked_at is None


def test_b_cannot_give_feedback_on_a_interaction(world):
    a, b, interaction_id, _ = world
    response = b.post("/v1/feedback", {"interaction_id": interaction_id, "outcome": "rejected"}, format="json")
    assert response.status_code == 404
    batch = b.post(
        "/v1/feedback", {"items": [{"interaction_id": interaction_id, "outcome": "rejected"}]}, format="json"
    )
    assert batch.json()["results"][0]["status"] == "rejected"
    row = Feedback.objects.get(tenant=a.tenant)
    assert (row.outcome, row.events_received) == ("accepted", 1)


def test_b_cannot_report_what_a_kept_nor_reach_a_by_client_id(world):
    a, b, interaction_id, _ = world
    named = {"interaction_id": interaction_id, "checkpoint_s": 30, "text": ""}
    response = b.post("/v1/feedback/persistence", named, format="json")
    assert response.status_code == 404 and "A's" not in response.content.decode()
    batch = b.post("/v1/feedback/persistence", {"items": [named]}, format="json").json()
    assert batch["results"][0]["status"] == "rejected"
    by_client_id = {"client_id": "secret-1", "checkpoint_s": 30, "text": ""}
    assert b.post("/v1/feedback/persistence", by_client_id, format="json").status_code == 202
    assert not PersistenceReport.objects.filter(tenant=a.tenant).exists()
    assert PersistenceReport.objects.get(tenant=b.tenant).interaction is None


def test_b_feedback_on_a_client_id_stays_in_b(world):
    a, b, _, _ = world
    assert b.post("/v1/feedback", {"client_id": "secret-1", "outcome": "rejected"}, format="json").status_code == 202
    assert Feedback.objects.get(tenant=a.tenant).outcome == "accepted"
    assert Feedback.objects.get(tenant=b.tenant).interaction is None


def test_b_reusing_a_client_id_creates_its_own_interaction(world):
    a, b, interaction_id, _ = world
    response = b.post("/v1/interactions", {"client_id": "secret-1", "prompt": "B", "completion": "B"}, format="json")
    assert response.status_code == 201 and response.json()["id"] != interaction_id
    assert Interaction.objects.get(tenant=a.tenant).prompt == "A's code"
    editor = b.post(
        "/v1/editor/autocomplete",
        {"completionId": "secret-1", "prompt": "B", "completion": "B", "accepted": False},
        format="json",
    )
    assert editor.status_code == 200
    assert Feedback.objects.get(tenant=a.tenant).outcome == "accepted"


def test_b_listings_hold_only_b(world):
    a, b, _, a_key = world
    assert b.get("/v1/interactions").json()["results"] == []
    assert a_key.prefix not in str(b.get("/v1/keys").json())
    assert all(e["target_id"] != str(a_key.pk) for e in b.get("/v1/audit-events").json())
    assert b.get("/v1/tenant").json()["slug"] == "tenant-b"


def test_public_routes_hold_no_tenant_data(world, client):
    for path in ("/health", "/api/schema/", "/api/docs/"):
        response = client.get(path)
        assert response.status_code == 200
        assert "A's" not in response.content.decode()


def test_b_cannot_complete_or_chat_with_a_adapter(world):
    a, b, _, _ = world
    base = BaseModel.objects.create(name="walls-base", path="/nonexistent", family="qwen")
    Adapter.objects.create(tenant=a.tenant, name="a-private", base_model=base, is_default=True)
    response = b.post("/v1/completions", {"model": "a-private", "prompt": "x"}, format="json")
    assert response.status_code == 404
    assert b.post("/v1/completions", {"prompt": "x"}, format="json").status_code == 404  # A's default is not B's
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert b.post("/v1/chat/completions", {**chat, "model": "a-private"}, format="json").status_code == 404
    assert b.post("/v1/chat/completions", chat, format="json").status_code == 404


def test_b_cannot_list_or_promote_a_adapter_versions(world):
    a, b, _, _ = world
    base = BaseModel.objects.create(name="walls-base-2", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=a.tenant, name="a-model", base_model=base)
    version = AdapterVersion.objects.create(
        tenant=a.tenant,
        adapter=adapter,
        number=1,
        artifact_path="/nonexistent/v1",
        vllm_name="a--a-model--v1",
        status="candidate",
        loaded_at="2026-11-21T00:00:00Z",
    )
    assert b.get("/v1/adapters").json() == []
    assert b.get("/v1/models").json()["data"] == []
    assert [m["id"] for m in a.get("/v1/models").json()["data"]] == ["a-model"]
    assert b.get("/v1/adapters/a-model/versions").status_code == 404
    assert b.get("/v1/adapters/a-model/versions/1").status_code == 404
    assert b.post("/v1/adapters/a-model/versions/1/promote").status_code == 404
    assert b.post("/v1/adapters/a-model/versions/1/purge").status_code == 404
    adapter.refresh_from_db()
    assert adapter.production_version is None and AdapterVersion.objects.get(pk=version.pk).status == "candidate"
    assert a.get("/v1/adapters/a-model/versions/1").json()["number"] == 1
    assert a.post("/v1/adapters/a-model/versions/1/promote").status_code == 200


def test_b_cannot_see_or_steer_a_training(world):
    from apps.training.models import TrainingPolicy, TrainingRun

    a, b, _, _ = world
    base = BaseModel.objects.create(name="walls-base-3", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=a.tenant, name="a-trained", base_model=base)
    run = TrainingRun.objects.create(tenant=a.tenant, adapter=adapter, status="failed", error="A's secret error")
    rejected = TrainingRun.objects.create(tenant=a.tenant, adapter=adapter, status="rejected")
    assert b.get("/v1/adapters/a-trained/training-policy").status_code == 404
    assert b.patch("/v1/adapters/a-trained/training-policy", {"enabled": False}, format="json").status_code == 404
    cases = {"cases": [{"prefix": "a", "suffix": "b", "middle": "c"}]}
    assert b.put("/v1/adapters/a-trained/eval-set", cases, format="json").status_code == 404
    assert b.get("/v1/adapters/a-trained/training-runs").status_code == 404
    assert b.post("/v1/adapters/a-trained/training-runs").status_code == 404
    assert b.post("/v1/adapters/a-trained/retrain").status_code == 404
    response = b.get(f"/v1/training-runs/{run.pk}")
    assert response.status_code == 404 and "secret" not in response.content.decode()
    assert b.post(f"/v1/training-runs/{rejected.pk}/exclude-window").status_code == 404
    assert not TrainingPolicy.objects.filter(adapter=adapter).exists()
    assert TrainingRun.objects.filter(adapter=adapter).count() == 2
    assert not TrainingRun.objects.filter(adapter=adapter, window_excluded_at__isnull=False).exists()


def test_b_cannot_see_touch_or_erase_a_end_users(world):
    from apps.cohorts.models import EndUser

    a, b, _, _ = world
    assert a.post("/v1/users/dev-a/opt-in").status_code == 200
    assert b.get("/v1/users/dev-a").status_code == 404
    assert b.delete("/v1/users/dev-a").status_code == 404
    assert b.get("/v1/users").json()["results"] == []
    everyone = b.get(f"/v1/users?cursor={cursor_encode('dev-')}&search=dev-a&exact_counts=true").json()
    assert everyone["results"] == [] and everyone["count"] == 0 and everyone["counts"]["total"] == 0
    # B opting in its own "dev-a" makes B's user, not A's
    assert b.post("/v1/users/dev-a/opt-out").status_code == 200
    assert EndUser.objects.get(tenant=a.tenant, external_id="dev-a").opted_in is True
    b.post("/v1/users/import", {"items": [{"end_user_id": "dev-a", "opted_in": False}]}, format="json")
    assert EndUser.objects.get(tenant=a.tenant, external_id="dev-a").opted_in is True


def test_b_cannot_see_or_act_on_a_experiments(world):
    from apps.experiments.models import Experiment

    a, b, _, _ = world
    base = BaseModel.objects.create(name="walls-base-4", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=a.tenant, name="a-exp", base_model=base)
    version = AdapterVersion.objects.create(
        tenant=a.tenant,
        adapter=adapter,
        number=1,
        artifact_path="/nonexistent/e1",
        vllm_name="a--a-exp--v1",
        status="candidate",
    )
    experiment = Experiment.objects.create(
        tenant=a.tenant, adapter=adapter, candidate_version=version, created_by="test", status="running", salt="s"
    )
    assert b.get("/v1/adapters/a-exp/experiments").status_code == 404
    assert b.post("/v1/adapters/a-exp/experiments", {"candidate_version": 1}, format="json").status_code == 404
    assert b.get("/v1/adapters/a-exp/assignment?user=x").status_code == 404
    assert b.post("/v1/adapters/a-exp/rollback", {"version": 1}, format="json").status_code == 404
    assert b.get("/v1/adapters/a-exp/holdout").status_code == 404
    assert b.put("/v1/adapters/a-exp/holdout", {"share": 0.5}, format="json").status_code == 404
    assert b.get(f"/v1/experiments/{experiment.pk}").status_code == 404
    assert b.get(f"/v1/experiments/{experiment.pk}/snapshots").status_code == 404
    for action in ("start", "stop", "promote", "rollback", "snapshot"):
        assert b.post(f"/v1/experiments/{experiment.pk}/{action}").status_code == 404, action
    experiment.refresh_from_db()
    assert experiment.status == "running"


def test_what_a_key_reads_ahead_serves_only_its_own_tenant(world):
    """Serving reads the adapter and end user with the API key, before the key is checked
    (ReadAhead): those rows are used only once the key proves valid, for its own tenant."""
    from rest_framework.test import APIClient

    from apps.serving.selectors import ReadAhead, serving_lookup
    from apps.tenants.selectors import api_key_find_with

    a, b, _, a_key = world
    base = BaseModel.objects.create(name="walls-ahead", path="/nonexistent", family="qwen")
    Adapter.objects.create(tenant=a.tenant, name="a-private", base_model=base, is_default=True)
    Adapter.objects.create(tenant=b.tenant, name="b-own", base_model=base, is_default=True)
    ahead = ReadAhead(name=None, external_id="")
    ahead.rows = api_key_find_with(prefix=a_key.prefix, also=ahead.reads(a_key.prefix))[1]
    ahead.tenant_id = a.tenant.pk
    assert serving_lookup(a.tenant, name=None, external_id="", ahead=ahead).adapter.name == "a-private"
    assert serving_lookup(b.tenant, name=None, external_id="", ahead=ahead).adapter.name == "b-own"
    forged = APIClient()  # A's key prefix with a secret that is not A's
    forged.credentials(HTTP_AUTHORIZATION=f"Bearer strop_{a_key.prefix}_{'x' * 32}")
    response = forged.post("/v1/completions", {"prompt": "x"}, format="json")
    assert response.status_code == 401 and "a-private" not in response.content.decode()


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"prompt": "x", "user": "dev\u0000one"}, {}),
        ({"prompt": "x", "model": "a\u0000b"}, {}),
        ({"prompt": "x"}, {"HTTP_X_STROP_USER": "dev\u0000one"}),
        ('{"prompt": "x", "user": "dev\\ud800"}', {}),
    ],
)
def test_what_serving_reads_ahead_never_turns_a_bad_body_into_a_500(world, body, headers):
    """The adapter and end user are read before the body is validated: a name Postgres cannot take
    is left to validation, which answers 400 after the key is checked (401 without a valid key)."""
    from rest_framework.test import APIClient

    a, _, _, a_key = world
    raw = body if isinstance(body, str) else None
    send = {"data": raw, "content_type": "application/json"} if raw else {"data": body, "format": "json"}
    response = a.post("/v1/completions", **send, **headers)
    assert response.status_code == 400, response.content
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=f"Bearer strop_{a_key.prefix}_{'x' * 32}")
    assert stranger.post("/v1/completions", **send, **headers).status_code == 401
