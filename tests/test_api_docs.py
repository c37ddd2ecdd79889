from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def test_openapi_schema_lists_the_ingest_endpoints(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    for path in ("/v1/interactions", "/v1/feedback", "/v1/editor/autocomplete", "/v1/keys"):
        assert path in schema["paths"]


@pytest.mark.parametrize("path", ["/api/docs/"])
def test_docs_pages_load_their_assets_from_this_server(client, path):
    page = client.get(path).content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sources, page
    assert all(not s.startswith(("http://", "https://", "//")) for s in sources), sources
    for source in sources:
        if source.startswith("/static/"):
            assert client.get(source).status_code == 200, source
