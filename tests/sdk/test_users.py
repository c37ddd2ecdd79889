"""``client.users.list`` pages by cursor (``page.next_cursor``) and still by offset, on both clients."""

from __future__ import annotations

import asyncio

import pytest
from strop import AsyncStrop, BadRequestError, Page

from apps.cohorts.models import EndUser

pytestmark = pytest.mark.django_db(transaction=True)

IDS = [f"dev-{n:02d}" for n in range(11)]


@pytest.fixture
def users(api, strop_client):
    strop_client.users.import_([{"end_user_id": user, "opted_in": n % 2 == 0} for n, user in enumerate(IDS)])
    strop_client.users.import_([{"end_user_id": "ops-1", "opted_in": True}])


def test_cursor_pages_walk_every_user_once_in_id_order(users, strop_client):
    seen, pages = [], 0
    page = strop_client.users.list(search="dev", limit=4)
    while True:
        assert isinstance(page, Page) and (page.count, page.count_capped) == (11, False)
        assert page.next_offset is None or pages == 0  # a cursor's page links by cursor, never by offset
        seen += [user.end_user_id for user in page.results]
        pages += 1
        if page.next_cursor is None:
            break
        page = strop_client.users.list(search="dev", limit=4, cursor=page.next_cursor)
    assert seen == IDS and pages == 3


def test_offset_pages_still_work(users, strop_client):
    seen = []
    page = strop_client.users.list(opted_in=True, limit=3)
    while True:
        seen += [user.end_user_id for user in page.results]
        if page.next_offset is None:
            break
        page = strop_client.users.list(opted_in=True, limit=3, offset=page.next_offset)
    assert seen == [*IDS[::2], "ops-1"] and page.previous_offset == 3


def test_a_bad_cursor_is_a_bad_request(users, strop_client):
    with pytest.raises(BadRequestError) as caught:
        strop_client.users.list(cursor="dev-03")
    assert caught.value.code == "invalid" and caught.value.param == "cursor"


def test_the_async_client_follows_the_cursor_too(users, api):
    async def main() -> list[str]:
        async with AsyncStrop(base_url=api.url, api_key=api.key) as client:
            first = await client.users.list(limit=8)
            second = await client.users.list(limit=8, cursor=first.next_cursor)
            assert second.next_cursor is None
            return [user.end_user_id for user in first.results + second.results]

    assert asyncio.run(main()) == [*IDS, "ops-1"]


def test_a_page_without_cursor_fields_reads_as_before():
    """An older server answers without ``next_cursor`` and ``count_capped``."""
    page = Page.from_json({"count": 2, "next": None, "previous": None, "results": [{"a": 1}]}, dict)
    assert (page.next_cursor, page.count_capped, page.next_offset) == (None, False, None)


def test_an_end_user_carries_when_their_consent_was_set(strop_client, api):
    opted_in = strop_client.users.opt_in("dev-42")
    row = EndUser.objects.get(tenant=api.tenant, external_id="dev-42")
    assert row.opted_in_changed_at is not None
    assert (opted_in.opted_in_changed_at, opted_in.created_at) == (row.opted_in_changed_at, row.created_at)
    assert opted_in.updated_at == row.opted_in_changed_at  # the earlier name
    opted_out = strop_client.users.opt_out("dev-42")
    row.refresh_from_db()
    assert opted_out.opted_in is False and opted_out.opted_in_changed_at == row.opted_in_changed_at
    (listed,) = strop_client.users.list(search="dev-42").results
    read = strop_client.users.get("dev-42")
    assert listed.opted_in_changed_at == read.opted_in_changed_at == row.opted_in_changed_at
