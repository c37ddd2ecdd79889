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


def test_adapter_endpoints_need_the_admin_scope(tenant, adapter, make_client):
    client = make_client(tenant, scopes=["serve"])
    assert client.get("/v1/adapters").status_code == 403
