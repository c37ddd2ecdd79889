"""Every page's query count is bounded: it does not grow with the data (aggregates run in SQL)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.dashboard.conftest import log_events
from tests.dashboard.routes import READ, url_for

pytestmark = pytest.mark.django_db


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def _grow(world, lora_source) -> None:
    """Much more of everything a page lists or aggregates."""
    from apps.adapters.services import adapter_version_register
    from apps.tenants.services import api_key_create
    from apps.training.services import training_run_start

    for hours in range(0, 30, 3):
        log_events(
            world.a,
            outcomes=["accepted", "rejected", "edited", "not_shown", None] * 8,
            minutes_ago=hours * 60 + 2,
            version=world.v2,
            user=f"dev-{hours}",
        )
    parent = world.v2
    for _ in range(3):
        parent = adapter_version_register(
            world.a, adapter=world.adapter, source_dir=lora_source, parent=parent, enqueue_load=False
        )
    training_run_start(world.a, adapter=world.adapter, actor="system")
    for n in range(6):
        api_key_create(world.a, name=f"key {n}", scopes=["ingest"], actor="user:1")


def test_the_overview_does_not_grow_with_interactions(login, world, lora_source):
    client = login(world.users["viewer"])
    url = url_for("overview", world)
    before = _queries(client, url)
    _grow(world, lora_source)
    assert _queries(client, url) == before
    assert before <= 16


@pytest.mark.parametrize("name", sorted(READ))
def test_no_page_grows_with_the_data(login, world, lora_source, name):
    client = login(world.users["viewer"])
    url = url_for(name, world)
    before = _queries(client, url)
    _grow(world, lora_source)
    after = _queries(client, url)
    assert after == before, f"{name}: {before} → {after} queries"
