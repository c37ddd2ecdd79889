from __future__ import annotations

import pytest

from apps.adapters.services import adapter_version_mark_loaded, adapter_version_register

pytestmark = pytest.mark.django_db


def test_admin_lists_adapters_and_versions_and_promotes(settings, client_a, adapter, make_lora_adapter):
    settings.VLLM_BASE_URLS = ["http://127.0.0.1:9"]  # nothing listens: promotion cannot load the version
    version = adapter_version_register(
        client_a.tenant, adapter=adapter, source_dir=make_lora_adapter(seed=31), enqueue_load=False
    )
    assert client_a.get("/v1/adapters").json()[0] == {
        **client_a.get("/v1/adapters").json()[0],
        "name": "autocomplete",
        "production_version": None,
    }
    versions = client_a.get("/v1/adapters/autocomplete/versions").json()
    assert [(v["number"], v["status"]) for v in versions] == [(1, "candidate")]

    refused = client_a.post("/v1/adapters/autocomplete/versions/1/promote")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "vllm_unavailable"
    assert client_a.get("/v1/adapters").json()[0]["production_version"] is None
    adapter_version_mark_loaded(version)
    promoted = client_a.post("/v1/adapters/autocomplete/versions/1/promote")
    assert promoted.status_code == 200 and promoted.json()["production_version"] == 1
    assert client_a.post("/v1/adapters/autocomplete/versions/9/promote").status_code == 404


def test_a_versions_read_carries_its_offline_evaluation_and_old_verdicts_read_back(
    client_a, adapter, make_lora_adapter
):
    from learning_shared.fim_metrics import CaseScore
    from learning_shared.offline_eval import fim_figures

    right, wrong = CaseScore(True, True, 1.0), CaseScore(False, False, 0.25)
    figures = fim_figures({"candidate": [right, right, wrong], "parent": [right, wrong, wrong]})
    gate = {
        "fim_check": "passed",
        "fim_count": 3,
        "fim_figures": figures,
        "fim_eval_set": {"cases": 5, "uploaded_at": "2026-11-27T06:00:00+00:00"},
    }
    old = {
        "fim_check": "passed",
        "fim_count": 2,
        "fim_candidate": {"exact_match": 0.5, "edit_similarity": 0.75},
        "fim_parent": {"exact_match": 0.5, "edit_similarity": 0.5},
    }
    for number, verdict in ((1, gate), (2, old), (3, None)):
        adapter_version_register(
            client_a.tenant,
            adapter=adapter,
            source_dir=make_lora_adapter(seed=40 + number),
            enqueue_load=False,
            metrics={"gate": verdict} if verdict else {},
        )

    new = client_a.get("/v1/adapters/autocomplete/versions/1").json()["offline_eval"]
    assert new["cases"] == 3 and new["eval_set"]["cases"] == 5 and new["check"] == "passed"
    assert new["candidate"]["first_line_match"]["value"] == pytest.approx(2 / 3)
    assert new["lift"]["first_line_match"]["value"] == pytest.approx(1 / 3)
    assert new["parent"]["exact_match"]["low"] < 1 / 3 < new["parent"]["exact_match"]["high"]
    stored_before = client_a.get("/v1/adapters/autocomplete/versions/2").json()["offline_eval"]
    assert stored_before["candidate"]["edit_similarity"] == {"value": 0.75, "low": None, "high": None, "n": 2}
    assert stored_before["candidate"]["first_line_match"] is None
    assert client_a.get("/v1/adapters/autocomplete/versions/3").json()["offline_eval"] is None
    assert client_a.get("/v1/adapters/autocomplete/versions/4").status_code == 404
    listed = {v["number"]: v["offline_eval"] for v in client_a.get("/v1/adapters/autocomplete/versions").json()}
    assert listed[1] == new and listed[3] is None


def test_adapter_endpoints_need_the_admin_scope(tenant, adapter, make_client):
    client = make_client(tenant, scopes=["serve"])
    assert client.get("/v1/adapters").status_code == 403
