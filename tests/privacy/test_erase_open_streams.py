"""Erasing an end user while the sweeper records one of their open streams
(apps.privacy.services.end_user_erase, apps.interactions.stream_parts): the erase locks the stream's
parts first, as the sweeper does, so it waits for the sweeper and then erases what it recorded."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.interactions.models import Feedback, Interaction, StreamPart
from apps.interactions.stream_parts import _stream_close
from apps.privacy.services import end_user_erase
from tests.interactions.test_stream_parts import _feedback, _open_stream, adapter  # noqa: F401  # the fixture


@pytest.mark.django_db(transaction=True)
def test_an_erase_beside_the_sweeper_leaves_no_partial_interaction_of_the_user(adapter):  # noqa: F811
    interaction_id = _open_stream(adapter, [(" a", [10])])
    _feedback(adapter.tenant, interaction_id)
    locked, errors = threading.Event(), []

    def sweeper() -> None:  # holds the stream's parts while the erase starts, then records it
        try:
            with transaction.atomic():
                list(StreamPart.objects.select_for_update().filter(interaction_id=interaction_id))
                locked.set()
                time.sleep(1.0)
                assert _stream_close(adapter.tenant_id, interaction_id, cutoff=timezone.now() + timedelta(minutes=3))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=sweeper)
    thread.start()
    assert locked.wait(30)
    end_user_erase(adapter.tenant, external_id="u1", actor="test")
    thread.join(30)
    assert not errors
    assert not Interaction.objects.filter(pk=interaction_id).exists()  # recorded by the sweeper, then erased
    assert not Feedback.objects.exists() and not StreamPart.objects.exists()
