"""The end-user API: opt in/out, import (JSON and CSV, 207 per item), list with counts, show, erase."""

from __future__ import annotations

import pytest

from apps.cohorts.models import ConsentChange, EndUser
from apps.interactions.models import Feedback, Interaction
from apps.tenants.models import AuditEvent

pytestmark = pytest.mark.django_db


def test_opt_in_and_out_write_history_and_audit(client_a):
    assert client_a.post("/v1/users/alice/opt-in").json()["opted_in"] is True
    assert client_a.post("/v1/users/alice/opt-out").json()["opted_in"] is False
    detail = client_a.get("/v1/users/alice").json()
    assert [h["opted_in"] for h in detail["history"]] == [False, True]
    assert {h["source"] for h in detail["history"]} == {"api"}
    assert AuditEvent.objects.filter(action__in=["end_user.opt_in", "end_user.opt_out"]).count() == 2


def test_import_json_judges_each_item(client_a):
    items = [
        {"end_user_id": "a", "opted_in": True},
        {"end_user_id": "", "opted_in": True},
        {"end_user_id": "b", "opted_in": "yes"},
        {"end_user_id": "c", "opted_in": False},
    ]
    response = client_a.post("/v1/users/import", {"items": items}, format="json")
    assert response.status_code == 207
    body = response.json()
    assert (body["opted_in"], body["opted_out"], body["rejected"]) == (1, 1, 2)
    assert body["results"][1]["error"]["field"] == "end_user_id"
    assert body["results"][2]["error"]["field"] == "opted_in"
    assert dict(EndUser.objects.values_list("external_id", "opted_in")) == {"a": True, "c": False}


def test_import_csv(client_a):
    csv = "end_user_id,opted_in\nx,true\ny,0\nz,maybe\n"
    response = client_a.post("/v1/users/import", csv, content_type="text/csv")
    assert response.status_code == 207, response.content
    assert response.json()["rejected"] == 1
    assert dict(EndUser.objects.values_list("external_id", "opted_in")) == {"x": True, "y": False}
    assert ConsentChange.objects.filter(source="import").count() == 1  # y was created opted out: no change


def test_list_search_and_counts(client_a):
    for name, flag in (("dev-1", True), ("dev-2", False), ("ops-1", True)):
        client_a.post(f"/v1/users/{name}/{'opt-in' if flag else 'opt-out'}")
    body = client_a.get("/v1/users?search=dev&opted_in=true").json()
    assert [u["end_user_id"] for u in body["results"]] == ["dev-1"]
    assert body["counts"] == {"total": 3, "opted_in": 2, "opted_out": 1}
    assert client_a.get("/v1/users?opted_in=perhaps").status_code == 400


def test_show_one_user_with_recent_interactions(client_a):
    client_a.post(
        "/v1/interactions",
        {"client_id": "i1", "prompt": "p", "completion": "c", "end_user_id": "bob", "opted_in": True},
        format="json",
    )
    client_a.post("/v1/feedback", {"client_id": "i1", "outcome": "accepted"}, format="json")
    detail = client_a.get("/v1/users/bob").json()
    assert detail["opted_in"] is True and detail["interactions"] == 1
    assert detail["recent_interactions"][0]["outcome"] == "accepted"
    assert client_a.get("/v1/users/nobody").status_code == 404


def test_erase_removes_every_row_of_that_user_and_nothing_of_anyone_elses(client_a, make_client, tenant):
    for n, user in enumerate(["gone", "gone", "stays"]):
        client_a.post(
            "/v1/interactions",
            {"client_id": f"e{n}", "prompt": "p", "completion": "c", "end_user_id": user, "opted_in": True},
            format="json",
        )
        client_a.post("/v1/feedback", {"client_id": f"e{n}", "outcome": "rejected"}, format="json")
    ingest_only = make_client(tenant, scopes=["ingest"])
    assert ingest_only.delete("/v1/users/gone").status_code == 403  # erasing needs the admin scope
    response = client_a.delete("/v1/users/gone")
    assert response.status_code == 200, response.content
    report = response.json()
    assert report["deleted"]["interactions"] == 2 and report["deleted"]["feedback"] == 2
    assert report["deleted"]["end_users"] == 1 and report["deleted"]["consent_history"] == 1
    assert not Interaction.objects.filter(end_user_id="gone").exists()
    assert not EndUser.objects.filter(external_id="gone").exists()
    assert not ConsentChange.objects.filter(end_user__external_id="gone").exists()
    assert Interaction.objects.filter(end_user_id="stays").count() == 1 and Feedback.objects.count() == 1
    audit = AuditEvent.objects.get(action="end_user.erase")
    assert "gone" not in str(audit.data) and audit.target_id == "erased"
    assert client_a.delete("/v1/users/gone").status_code == 404
