"""Feedback on a stream that ends while the feedback is read (apps.interactions.services.feedback):
it found neither the interaction (not yet committed) nor the open stream (its parts gone by then),
yet it is recorded on the interaction, never answered not found."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from apps.interactions.models import Feedback, StreamPart
from apps.interactions.served import served_rows
from apps.interactions.stream_parts import stream_parts_recorded
from tests.interactions.test_stream_parts import _feedback, _fields, _open_stream, adapter  # noqa: F401  # the fixture


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LOCK TABLE ... IN ACCESS EXCLUSIVE MODE is Postgres's")
@pytest.mark.django_db(transaction=True)
def test_feedback_on_a_stream_ending_meanwhile_is_recorded_not_found_never(adapter):  # noqa: F811
    interaction_id = _open_stream(adapter, [(" a", [10])])
    rows = served_rows(adapter.tenant, **_fields(adapter, interaction_id, " a b", [10, 11], finish="length"))
    ending, errors = threading.Event(), []

    def stream_end() -> None:
        try:
            with transaction.atomic():
                # Readers of the parts wait until the end commits: after the feedback read the interactions.
                with connection.cursor() as cursor:
                    cursor.execute(f"LOCK TABLE {StreamPart._meta.db_table} IN ACCESS EXCLUSIVE MODE")
                stream_parts_recorded(adapter.tenant, rows)
                ending.set()
                time.sleep(1.0)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=stream_end)
    thread.start()
    assert ending.wait(30)
    result = _feedback(adapter.tenant, interaction_id)
    thread.join(30)
    assert not errors
    assert result.status == "recorded", result
    assert Feedback.objects.get(tenant=adapter.tenant).interaction_id == interaction_id
