"""Suite-wide fixtures. Tests talk to the real Postgres and Redis (see the Makefile's `test`)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

# Each run counts its metrics in a folder of its own (var/prometheus belongs to `make up`); this must
# happen before anything loads prometheus_client, which reads the variable at import.
assert "prometheus_client" not in sys.modules, "prometheus_client was loaded before tests/conftest.py"
os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="strop-test-metrics-")
atexit.register(shutil.rmtree, os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)

# Django is imported inside fixtures only, so `pytest tests/gpu_trainer -p no:django` also works.

# Plugins with heavier fixtures: models, the vLLM server, Celery workers, serving, private Postgres / Redis.
pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.vllm",
    "tests.fixtures.workers",
    "tests.fixtures.serving",
    "tests.fixtures.services",
    "tests.fixtures.object_store",
]


@pytest.fixture
def make_tenant(db: Any) -> Callable[..., Any]:
    from apps.tenants.services import tenant_create

    counter = iter(range(1, 10_000))

    def make(slug: str | None = None, **kwargs: Any) -> Any:
        slug = slug or f"tenant-{next(counter)}"
        return tenant_create(name=slug.title(), slug=slug, **kwargs)

    return make


@pytest.fixture
def migrate_to(transactional_db: Any) -> Any:
    """``migrate_to([(app, migration), ...])``: the database migrated there (either way), the models
    of that state returned; migrated back to the latest after the test. Migrations run outside a
    test's transaction, hence the transactional database."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    def migrate(targets: list[tuple[str, str]]) -> Any:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(targets)
        return executor.loader.project_state(targets).apps

    yield migrate
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


@pytest.fixture
def make_client(db: Any) -> Callable[..., Any]:
    """``make(tenant, scopes=None)``: an APIClient sending a fresh key of that tenant; it carries
    ``.tenant`` and ``.raw_key``."""
    from rest_framework.test import APIClient

    from apps.tenants.services import ALL_SCOPES, api_key_create

    def make(tenant: Any, scopes: list[str] | None = None) -> Any:
        issued = api_key_create(tenant, name="test", scopes=scopes or list(ALL_SCOPES))
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw_key}")
        client.tenant, client.raw_key = tenant, issued.raw_key
        return client

    return make


@pytest.fixture
def tenant(make_tenant: Callable[..., Any]) -> Any:
    return make_tenant("acme")


@pytest.fixture
def client_a(tenant: Any, make_client: Callable[..., Any]) -> Any:
    return make_client(tenant)


@pytest.fixture(scope="session", autouse=True)
def _fresh_test_redis(request: pytest.FixtureRequest) -> None:
    """Each run gets a fresh test database, whose ids restart; so must the counters keyed by them."""
    if not request.config.pluginmanager.hasplugin("django"):
        return
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def _adapter_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Adapter versions and training runs' folders written by a test land in temporary folders, never
    in the repo's var/ (where a `make up` worker keeps its own, and other test sessions theirs)."""
    if request.config.pluginmanager.hasplugin("django"):
        settings = request.getfixturevalue("settings")
        settings.STROP_ADAPTER_ROOT = tmp_path_factory.mktemp("adapters")
        settings.STROP_RUN_ROOT = tmp_path_factory.mktemp("runs")


@pytest.fixture
def served(settings, vllm_server):
    """Django pointed at the session's real vLLM server."""
    settings.VLLM_BASE_URLS = [vllm_server.base_url]
    settings.VLLM_MAX_LORA_RANK = vllm_server.max_lora_rank
    return vllm_server
