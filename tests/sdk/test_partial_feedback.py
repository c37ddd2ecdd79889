"""A partial accept through the SDK: ``outcome="partial"`` with ``accepted_chars``, on both clients."""

from __future__ import annotations

import asyncio

import pytest
from strop import AsyncStrop, BadRequestError

from apps.interactions.models import Feedback

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_partial_accept_is_recorded_and_read_back(strop_client, api):
    interaction = strop_client.interactions.log(client_id="p-1", prompt="x = ", completion="return a + b")
    result = strop_client.feedback.send(interaction_id=interaction.id, outcome="partial", accepted_chars=8)
    assert result.status == "recorded"
    feedback = strop_client.interactions.get(interaction.id).feedback
    assert feedback is not None and (feedback.outcome, feedback.accepted_chars) == ("partial", 8)


@pytest.mark.parametrize("accepted_chars", [0, 12, None])
def test_an_accepted_chars_outside_the_completion_is_a_bad_request_naming_it(strop_client, api, accepted_chars):
    strop_client.interactions.log(client_id="p-2", prompt="x = ", completion="return a + b")
    with pytest.raises(BadRequestError) as caught:
        strop_client.feedback.send(client_id="p-2", outcome="partial", accepted_chars=accepted_chars)
    assert (caught.value.status, caught.value.field) == (400, "accepted_chars")
    assert not Feedback.objects.filter(tenant=api.tenant).exists()


def test_the_async_client_sends_and_enqueues_partial_accepts(api):
    async def main() -> list[str]:
        async with AsyncStrop(base_url=api.url, api_key=api.key, timeout=60) as client:
            for name in ("a-1", "a-2"):
                await client.interactions.log(client_id=name, prompt="x = ", completion="total = 0.0")
            sent = await client.feedback.send(client_id="a-1", outcome="partial", accepted_chars=5)
            client.feedback.enqueue(client_id="a-2", outcome="partial", accepted_chars=9)
            assert await client.feedback.flush(timeout=30)
            return [sent.status]

    assert asyncio.run(main()) == ["recorded"]
    rows = Feedback.objects.filter(tenant=api.tenant).order_by("interaction__client_id")
    assert [(row.outcome, row.accepted_chars) for row in rows] == [("partial", 5), ("partial", 9)]
