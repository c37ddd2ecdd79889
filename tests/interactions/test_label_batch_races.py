"""Label batches that meet (apps.interactions.services.feedback and .persistence): two batches naming
the same interactions in opposite orders both land, never deadlock, as their rows are written in key
order; and a deadlock that still happens is answered 503 with ``Retry-After``, never a 500."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

from apps.common.exception_handler import exception_handler
from apps.interactions.models import Feedback, PersistenceReport
from apps.interactions.services import feedback_ingest, interactions_ingest, persistence_ingest
from tests.fixtures.locks import held_in_a_thread, wait_for_a_waiting_lock

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks between connections: Postgres"),
    pytest.mark.django_db(transaction=True),
]



def _feedback(interaction_id: str) -> dict[str, Any]:
    return {"interaction_id": interaction_id, "outcome": "rejected"}


def _report(interaction_id: str) -> dict[str, Any]:
    return {"interaction_id": interaction_id, "checkpoint_s": 30, "retained_ratio": 0.5}


@pytest.mark.parametrize(
    ("ingest", "item", "model"),
    [(feedback_ingest, _feedback, Feedback), (persistence_ingest, _report, PersistenceReport)],
    ids=["feedback", "persistence"],
)
def test_two_batches_naming_the_same_interactions_in_opposite_orders_both_land(
    make_tenant, ingest: Callable[..., Any], item: Callable[[str], dict[str, Any]], model: Any
):
    tenant = make_tenant("opposite-orders")
    logged = [{"client_id": f"o-{n}", "prompt": "x = ", "completion": "1"} for n in range(2)]
    ids = [str(r.id) for r in interactions_ingest(tenant, items=logged)]
    assert [r.status for r in ingest(tenant, items=[item(i) for i in ids])] == ["recorded", "recorded"]
    first, second = sorted(ids, key=uuid.UUID)
    answers: dict[str, Any] = {}

    def block(holding: threading.Event) -> None:  # holds one row until both batches wait
        with transaction.atomic():
            list(model.objects.select_for_update().filter(tenant=tenant, interaction_id=second))
            holding.set()
            wait_for_a_waiting_lock(30, sessions=2)

    def batch(order: list[str]) -> None:  # the other batch, in its own connection
        try:
            answers["other"] = ingest(tenant, items=[item(i) for i in order])
        except Exception as exc:
            answers["other"] = exc
        finally:
            connection.close()

    with held_in_a_thread(block):
        other = threading.Thread(target=batch, args=([second, first],))
        other.start()
        wait_for_a_waiting_lock()  # the other batch waits for the held row: it goes first
        try:
            answers["this"] = ingest(tenant, items=[item(i) for i in [first, second]])
        except OperationalError as exc:  # a deadlock: Postgres aborted this batch
            answers["this"] = exc
        other.join(60)
    assert not other.is_alive()
    for name in ("this", "other"):
        assert not isinstance(answers[name], Exception), answers[name]  # a deadlock aborted it
        assert [r.status for r in answers[name]] == ["recorded", "recorded"]
    assert sorted(model.objects.filter(tenant=tenant).values_list("events_received", flat=True)) == [3, 3]


def test_a_deadlock_that_still_happens_is_a_503_to_send_again_never_a_500(make_tenant):
    tenant = make_tenant("deadlocked")
    logged = [{"client_id": f"d-{n}", "prompt": "x = ", "completion": "1"} for n in range(2)]
    ids = [str(r.id) for r in interactions_ingest(tenant, items=logged)]
    feedback_ingest(tenant, items=[_feedback(i) for i in ids])
    rows = list(Feedback.objects.filter(tenant=tenant).order_by("pk").values_list("pk", flat=True))
    errors: list[Exception] = []

    def lock_in_order(order: list[int], holding: threading.Event | None) -> None:
        try:
            with transaction.atomic():
                Feedback.objects.select_for_update().get(pk=order[0])
                if holding is not None:
                    holding.set()
                    wait_for_a_waiting_lock()
                Feedback.objects.select_for_update().get(pk=order[1])
        except OperationalError as exc:
            errors.append(exc)

    locked = threading.Event()
    other = threading.Thread(target=lambda: (lock_in_order(rows, locked), connection.close()))
    other.start()
    assert locked.wait(30)
    lock_in_order(rows[::-1], None)  # each holds the row the other wants
    other.join(60)
    (deadlock,) = errors
    response = exception_handler(deadlock, {})
    assert response is not None and response.status_code == 503
    assert response.data["error"]["code"] == "service_unavailable" and int(response["Retry-After"]) >= 1
    assert "deadlock" in response.data["error"]["message"]
