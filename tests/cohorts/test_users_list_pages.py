"""``GET /v1/users`` at any size: keyset pages by an opaque cursor (offset pages still work), counts
that stop at a cap and say so, the dashboard's search rule, and the tenant wall on all of it."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.cohorts.services import end_users_observe
from apps.common.parsing import cursor_encode

pytestmark = pytest.mark.django_db

OPTED_OUT = [f"u-{n:03d}" for n in range(120) if n % 3]


@pytest.fixture
def tenants(make_tenant: Any, make_client: Any) -> Any:
    """Tenant A: u-000…u-119 (every third opted in) and Dev-Zed; tenant B: ids that sort among A's."""
    a, b = make_tenant("acme"), make_tenant("bravo")
    end_users_observe(a, observations=[(f"u-{n:03d}", n % 3 == 0) for n in range(120)], source="import",
                      actor="system", default=False)  # fmt: skip
    end_users_observe(a, observations=[("Dev-Zed", True)], source="import", actor="system", default=False)
    end_users_observe(b, observations=[("dev-zebra", True), ("u-050x", False), ("u-secret", False)],
                      source="import", actor="system", default=False)  # fmt: skip
    return make_client(a), make_client(b)


def walk(client: Any, url: str, *, by: str) -> tuple[list[str], int]:
    """Every id of a list, following ``next_cursor`` (``by="cursor"``) or ``next`` (``by="next"``);
    (ids in order, pages read)."""
    ids: list[str] = []
    pages = 0
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        ids += [u["end_user_id"] for u in body["results"]]
        pages += 1
        if by == "cursor":
            cursor = body["next_cursor"]
            url = f"{url.split('&cursor=')[0]}&cursor={cursor}" if cursor else ""
        else:
            url = body["next"] or ""
    return ids, pages


def test_cursor_pages_walk_every_user_once_in_id_order(tenants):
    a, _ = tenants
    ids, pages = walk(a, "/v1/users?limit=7", by="cursor")
    assert ids == ["Dev-Zed", *(f"u-{n:03d}" for n in range(120))] and pages == 18  # 121 users, 7 a page


def test_cursor_pages_keep_the_filters_and_the_search(tenants):
    a, _ = tenants
    assert walk(a, "/v1/users?opted_in=false&limit=9", by="cursor")[0] == OPTED_OUT
    assert walk(a, "/v1/users?search=U-1&limit=4", by="cursor")[0] == [f"u-{n:03d}" for n in range(100, 120)]
    assert walk(a, "/v1/users?search=U-0&opted_in=true&limit=5", by="cursor")[0] == [
        f"u-{n:03d}" for n in range(0, 100, 3)
    ]


def test_a_cursor_pages_next_link_carries_the_cursor_and_the_filters(tenants):
    a, _ = tenants
    first = a.get("/v1/users?opted_in=false&limit=5").json()
    second = a.get(f"/v1/users?opted_in=false&limit=5&cursor={first['next_cursor']}").json()
    query = parse_qs(urlsplit(second["next"]).query)
    assert query == {"opted_in": ["false"], "limit": ["5"], "cursor": [second["next_cursor"]]}
    assert second["previous"] is None  # a keyset walks forward
    assert walk(a, "/v1/users?opted_in=false&limit=5", by="next")[0] == OPTED_OUT  # the next links, from page 1
    via_links = [u["end_user_id"] for u in a.get(second["next"]).json()["results"]]
    assert via_links == OPTED_OUT[10:15]


def test_the_last_page_has_no_next_cursor(tenants):
    a, _ = tenants
    last = a.get(f"/v1/users?cursor={cursor_encode('u-115')}").json()
    assert [u["end_user_id"] for u in last["results"]] == [f"u-{n}" for n in range(116, 120)]
    assert last["next_cursor"] is None and last["next"] is None


def test_offset_pages_still_work_as_before_and_offer_a_cursor(tenants):
    a, _ = tenants
    ids, pages = walk(a, "/v1/users?opted_in=false&limit=9", by="next")
    assert ids == OPTED_OUT and pages == 9
    page = a.get("/v1/users?opted_in=false&limit=9&offset=18").json()
    assert [u["end_user_id"] for u in page["results"]] == OPTED_OUT[18:27]
    assert parse_qs(urlsplit(page["next"]).query)["offset"] == ["27"]
    assert parse_qs(urlsplit(page["previous"]).query)["offset"] == ["9"]
    assert (page["count"], page["count_capped"]) == (80, False)
    switched = a.get(f"/v1/users?opted_in=false&limit=9&cursor={page['next_cursor']}").json()
    assert [u["end_user_id"] for u in switched["results"]] == OPTED_OUT[27:36]


def test_an_offset_past_the_end_is_an_empty_page(tenants):
    a, _ = tenants
    body = a.get("/v1/users?offset=500").json()
    assert body["results"] == [] and body["next"] is None and body["next_cursor"] is None
    assert body["count"] == 121


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "not a cursor!",  # outside base64url's alphabet
        "u-010",  # a raw id, not a cursor
        "%00",  # a NUL byte
        _b64(b"\xff\xfe"),  # not UTF-8
        _b64(b"[1, 2]"),  # JSON of another shape
        _b64(b'{"after": 5}'),
        _b64(b'{"after": ""}'),
        _b64(b'{"after": "u-010", "x": 1}'),
        _b64(b'{"after": "u-0\\u0000x"}'),  # a NUL inside, which Postgres refuses in text
        _b64(b'{"after": "' + b"x" * 201 + b'"}'),  # longer than any id
        _b64(b'{"after": "\\ud800"}'),  # a lone surrogate, which no database text takes
        "",
        "A" * 1201,
    ],
)
def test_a_cursor_no_page_gave_is_a_400_naming_it(tenants, cursor):
    a, _ = tenants
    response = a.get(f"/v1/users?cursor={cursor}")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid", "cursor")
    assert "next_cursor" in error["message"]


def test_a_cursor_and_an_offset_together_are_a_400(tenants):
    a, _ = tenants
    response = a.get(f"/v1/users?offset=0&cursor={cursor_encode('u-010')}")
    assert response.status_code == 400 and response.json()["error"]["param"] == "cursor"


def test_counts_stop_at_the_cap_and_say_so(tenants, monkeypatch):
    a, _ = tenants
    body = a.get("/v1/users").json()
    assert body["counts"] == {"total": 121, "opted_in": 41, "opted_out": 80}
    assert body["counts_capped"] == {"total": False, "opted_in": False, "opted_out": False}
    assert (body["count"], body["count_capped"]) == (121, False)
    monkeypatch.setattr("apps.cohorts.apis.COUNT_CAP", 50)
    # A page by offset counts exactly unless told not to (older clients read count from it).
    assert a.get("/v1/users?limit=10").json()["counts"] == {"total": 121, "opted_in": 41, "opted_out": 80}
    body = a.get("/v1/users?limit=10&exact_counts=false").json()
    assert body["counts"] == {"total": 50, "opted_in": 41, "opted_out": 50}
    assert body["counts_capped"] == {"total": True, "opted_in": False, "opted_out": True}
    assert (body["count"], body["count_capped"]) == (50, True)
    by_cursor = a.get(f"/v1/users?limit=10&cursor={cursor_encode('u-000')}").json()
    assert by_cursor["counts_capped"]["total"] and by_cursor["count_capped"]
    searched = a.get("/v1/users?search=u-1&exact_counts=false").json()
    assert (searched["count"], searched["count_capped"]) == (20, False)


def test_an_offset_page_counts_at_least_a_page_past_itself(tenants, monkeypatch):
    """A client that pages ``while offset + limit < count`` reaches the end, whatever the cap."""
    a, _ = tenants
    monkeypatch.setattr("apps.cohorts.apis.COUNT_CAP", 20)
    seen, offset = [], 0
    while True:
        body = a.get(f"/v1/users?limit=10&offset={offset}&exact_counts=false").json()
        seen += [u["end_user_id"] for u in body["results"]]
        assert body["count"] >= offset + len(body["results"])
        if offset + 10 >= body["count"]:
            break
        offset += 10
    assert len(seen) == 121 and len(set(seen)) == 121


def test_exact_counts_are_there_when_asked_for(tenants, monkeypatch):
    a, _ = tenants
    monkeypatch.setattr("apps.cohorts.apis.COUNT_CAP", 50)
    body = a.get("/v1/users?exact_counts=true&opted_in=false").json()
    assert body["counts"] == {"total": 121, "opted_in": 41, "opted_out": 80}
    assert not any(body["counts_capped"].values())
    assert (body["count"], body["count_capped"]) == (80, False)
    assert a.get("/v1/users?exact_counts=perhaps").status_code == 400


def test_a_search_of_one_or_two_characters_matches_the_start_of_the_id(tenants):
    a, _ = tenants
    assert [u["end_user_id"] for u in a.get("/v1/users?search=de").json()["results"]] == ["Dev-Zed"]
    assert a.get("/v1/users?search=ZE").json()["results"] == []  # inside the id, not its start
    assert [u["end_user_id"] for u in a.get("/v1/users?search=v-Z").json()["results"]] == ["Dev-Zed"]


def test_no_page_shows_another_tenants_users(tenants):
    a, b = tenants
    ids = walk(a, "/v1/users?limit=6", by="cursor")[0] + walk(a, "/v1/users?search=u-0&limit=6", by="cursor")[0]
    assert not {"dev-zebra", "u-050x", "u-secret"} & set(ids)
    after_theirs = a.get(f"/v1/users?limit=3&cursor={cursor_encode('u-050x')}").json()  # B's id as a position
    assert [u["end_user_id"] for u in after_theirs["results"]] == ["u-051", "u-052", "u-053"]
    body = b.get(f"/v1/users?cursor={cursor_encode('u-000')}").json()
    assert [u["end_user_id"] for u in body["results"]] == ["u-050x", "u-secret"]
    assert body["counts"] == {"total": 3, "opted_in": 1, "opted_out": 2}


def test_no_read_of_the_end_users_goes_unbounded(tenants):
    """Every query of the list is bounded by a LIMIT, a page deep in the list included: none
    costs what the tenant holds (counts capped: by cursor, or asked for)."""
    a, _ = tenants
    deep = a.get("/v1/users?limit=5").json()
    for url in (
        f"/v1/users?limit=5&cursor={deep['next_cursor']}",
        "/v1/users?search=u-1&opted_in=false&exact_counts=false",
    ):
        with CaptureQueriesContext(connection) as queries:
            assert a.get(url).status_code == 200
        reads = [q["sql"] for q in queries.captured_queries if "cohorts_enduser" in q["sql"]]
        assert len(reads) == 5  # the page, its count, the three counts
        assert all("LIMIT" in sql for sql in reads), reads


def test_cursors_walk_ids_of_the_longest_non_ascii_kind(make_tenant: Any, make_client: Any) -> None:
    """A cursor after an id of 200 four-byte characters is one this list takes back."""
    tenant = make_tenant("wide")
    ids = sorted(["\U0001f600" * 200, "用户" * 100, "ü" * 200])
    end_users_observe(tenant, observations=[(i, True) for i in ids], source="import", actor="system", default=False)
    seen, _ = walk(make_client(tenant), "/v1/users?limit=1", by="cursor")
    assert sorted(seen) == ids  # each once (in the database's collation, which may differ from Python's)
