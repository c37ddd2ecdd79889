"""Suite-wide fixtures. Tests talk to the real Postgres and Redis (see the Makefile's `test`)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.tenants.models import Tenant
from apps.tenants.services import ALL_SCOPES, api_key_create, tenant_create

# Plugins with heavier fixtures (models, the vLLM server), loaded when present.
pytest_plugins = [
    name for name in ("tests.fixtures.models", "tests.fixtures.vllm") if importlib.util.find_spec(name) is not None
]


class KeyedClient(APIClient):
    """An APIClient that sends one tenant's API key on every request."""

    tenant: Tenant
    raw_key: str


@pytest.fixture
def make_tenant(db: Any) -> Callable[..., Tenant]:
    counter = iter(range(1, 10_000))

    def make(slug: str | None = None, **kwargs: Any) -> Tenant:
        slug = slug or f"tenant-{next(counter)}"
        return tenant_create(name=slug.title(), slug=slug, **kwargs)

    return make


@pytest.fixture
def make_client(db: Any) -> Callable[..., KeyedClient]:
    def make(tenant: Tenant, scopes: list[str] | None = None) -> KeyedClient:
        issued = api_key_create(tenant, name="test", scopes=scopes or list(ALL_SCOPES))
        client = KeyedClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw_key}")
        client.tenant, client.raw_key = tenant, issued.raw_key
        return client

    return make


@pytest.fixture
def tenant(make_tenant: Callable[..., Tenant]) -> Tenant:
    return make_tenant("acme")


@pytest.fixture
def client_a(tenant: Tenant, make_client: Callable[..., KeyedClient]) -> KeyedClient:
    return make_client(tenant)


def post_json(client: APIClient, path: str, body: Any) -> Any:
    return client.post(path, body, format="json")


@pytest.fixture(scope="session", autouse=True)
def _fresh_test_redis() -> None:
    """Each run gets a fresh test database, whose ids restart; so must the counters keyed by them."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def _adapter_root(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Adapter versions written by a test land in a temporary folder, never in the repo's var/."""
    settings.STROP_ADAPTER_ROOT = tmp_path_factory.mktemp("adapters")
