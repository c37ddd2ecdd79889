"""The cohorts page at any size: counts that stop at a cap (and say so), the search for any part of
an id (by a trigram index on Postgres), keyset pages by id, and the tenant wall on all of it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse

from apps.cohorts.selectors import end_user_counts_capped
from apps.cohorts.services import end_users_observe

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenants(make_tenant: Any, make_user: Any, client: Any) -> Any:
    a, b = make_tenant("acme"), make_tenant("bravo")
    end_users_observe(a, observations=[(f"u-{n:03d}", n % 3 == 0) for n in range(120)], source="import",
                      actor="system", default=False)  # fmt: skip
    end_users_observe(a, observations=[("Dev-Zed", True)], source="import", actor="system", default=False)
    end_users_observe(b, observations=[("dev-zebra", True), ("u-secret", False)], source="import", actor="system",
                      default=False)  # fmt: skip
    client.force_login(make_user("vera", a, "viewer"))
    return a, b


def cohorts_url(tenant: Any) -> str:
    return reverse("dashboard:cohorts", kwargs={"tenant_slug": tenant.slug})


def ids_on(body: str) -> list[str]:
    return re.findall(r"\?end_user_id=([^\"&]+)\"", body)


def test_counts_stop_at_the_cap_and_say_more(tenants):
    a, _ = tenants
    counts = end_user_counts_capped(a, cap=50)
    assert (counts["total"].value, counts["total"].more) == (50, True)
    assert (counts["opted_in"].value, counts["opted_in"].more) == (41, False)  # 40 of the u-, and Dev-Zed
    assert counts["opted_out"].more
    exact = end_user_counts_capped(a)
    assert (exact["total"].value, exact["total"].more) == (121, False)


def test_the_page_labels_capped_counts_and_charts_the_change(tenants, client, monkeypatch):
    a, _ = tenants
    body = client.get(cohorts_url(a)).content.decode()
    assert 'data-stat="known">121<' in body and 'data-stat="opted-in">41<' in body
    assert 'data-note="capped"' not in body and "End users opted in at the end of each UTC day" in body
    monkeypatch.setattr("apps.dashboard.views.cohorts.COUNT_CAP", 30)
    body = client.get(cohorts_url(a)).content.decode()
    assert 'data-stat="known"><span title="more than 30: counted up to 30">30+</span><' in body
    assert 'data-stat="opted-in"><span title="more than 30: counted up to 30">30+</span><' in body
    assert 'data-note="capped"' in body and "Counts stop at 30 here" in body
    assert "Change in end users opted in since the first of the last 30 UTC days" in body


def test_search_finds_any_part_of_the_id_in_any_case_within_the_tenant(tenants, client):
    a, _ = tenants
    assert ids_on(client.get(cohorts_url(a) + "?q=v-z").content.decode()) == ["Dev-Zed"]
    assert ids_on(client.get(cohorts_url(a) + "?q=DEV-ZE").content.decode()) == ["Dev-Zed"]  # not B's dev-zebra
    assert ids_on(client.get(cohorts_url(a) + "?q=011").content.decode()) == ["u-011"]
    assert ids_on(client.get(cohorts_url(a) + "?q=-11").content.decode()) == [f"u-11{n}" for n in range(10)]
    body = client.get(cohorts_url(a) + "?q=secret").content.decode()
    assert "No end user matches" in body and "u-secret" not in body


def test_keyset_pages_walk_every_user_once_in_id_order_keeping_the_filters(tenants, client):
    a, _ = tenants
    seen: list[str] = []
    url = cohorts_url(a) + "?state=out"
    while url:
        body = client.get(url).content.decode()
        seen += ids_on(body)
        following = re.search(r'href="\?([^"]*)" rel="next"', body)
        url = cohorts_url(a) + "?" + following.group(1).replace("&amp;", "&") if following else ""
        assert not following or "state=out" in following.group(1)
    assert seen == [f"u-{n:03d}" for n in range(120) if n % 3]
    past = client.get(cohorts_url(a) + "?state=out&after=u-119").content.decode()
    assert "No more end users" in past and 'rel="first"' not in past and "Back to the first" in past


def test_an_after_cursor_shows_nothing_of_another_tenant(tenants, client):
    a, _ = tenants
    body = client.get(cohorts_url(a) + "?after=u-119").content.decode()
    assert "u-secret" not in body and "dev-zebra" not in body and ids_on(body) == []



def test_a_cursor_with_a_nul_byte_starts_from_the_first_page(tenants, client):
    a, _ = tenants
    response = client.get(cohorts_url(a) + "?after=u-0%00x")  # Postgres refuses NUL in text
    assert response.status_code == 200
    first = ids_on(client.get(cohorts_url(a)).content.decode())
    assert first and ids_on(response.content.decode()) == first


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigram index is Postgres's")
def test_the_trigram_index_is_built_and_valid(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'cohorts_enduser_external_id_trgm'"
        )
        valid, definition = cursor.fetchone()
    assert valid and "gin_trgm_ops" in definition and "upper" in definition.lower()


def test_a_search_of_one_or_two_characters_finds_ids_that_start_with_them(tenants, client):
    a, _ = tenants
    assert ids_on(client.get(cohorts_url(a) + "?q=de").content.decode()) == ["Dev-Zed"]  # not B's dev-zebra
    assert ids_on(client.get(cohorts_url(a) + "?q=ZE").content.decode()) == []  # inside the id, not its start
    assert len(ids_on(client.get(cohorts_url(a) + "?q=U").content.decode())) == 50  # a first page of the u-
