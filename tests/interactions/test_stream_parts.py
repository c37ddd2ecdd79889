"""An open stream's parts (apps.interactions.stream_parts): never an interaction until its stream ends
or the sweeper records it as partial; feedback on it waits as pending and is never lost; a write
isolates a bad part; a stream's last write merges metadata. The serving side, with a worker killed
outright, is in tests/serving/test_async_serving.py."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.adapters.services import adapter_create, base_model_register
from apps.cohorts.models import EndUser
from apps.common.exceptions import ApplicationError
from apps.interactions.models import Feedback, Interaction, ServingFailure, StreamPart
from apps.interactions.served import ServedCompletion, interactions_record_served, served_rows
from apps.interactions.services import feedback_ingest
from apps.interactions.stream_parts import Part, stream_part_head, stream_parts_sweep, stream_parts_write
from apps.privacy.selectors import end_user_erase_preview
from apps.privacy.services import end_user_erase
from apps.serving.services import Route
from apps.serving.vllm_calls import serving_failure_record
from apps.training.selectors import training_events_eligible

pytestmark = pytest.mark.django_db


@pytest.fixture
def adapter(make_tenant, tiny_starter_model):
    base = base_model_register(name="base", path=tiny_starter_model)
    tenant = make_tenant()
    EndUser.objects.create(tenant=tenant, external_id="u1", opted_in=True)  # their events may train
    return adapter_create(tenant, name="tab", base_model=base, is_default=True)


def _fields(adapter, interaction_id, text="", tokens=(), *, finish=None, metadata=None) -> dict:
    return dict(
        choices=[ServedCompletion(interaction_id, text, list(tokens), [-0.5] * len(tokens), finish)],
        prompt="def f():",
        prefix="",
        suffix="",
        prompt_token_ids=[1, 2],
        model_name="tab",
        adapter_id=adapter.pk,
        adapter_version_id=None,
        experiment_id=None,
        experiment_arm="",
        end_user_id="u1",
        end_user_opted_in=True,
        served_at=timezone.now(),
        latency_ms=12.0,
        metadata=metadata or {"temperature": 0.2},
    )


def _open_stream(adapter, pieces: list[tuple[str, list[int]]]) -> uuid.UUID:
    """The parts a stream serving ``pieces`` writes, one write each, as apps.serving.stream_record does."""
    interaction_id = uuid.uuid4()
    head, metadata = stream_part_head(served_rows(adapter.tenant, **_fields(adapter, interaction_id))[0])
    for seq, (text, tokens) in enumerate(pieces):
        first = seq == 0
        part = Part(
            adapter.tenant_id, interaction_id, seq, text, tokens, [-0.5] * len(tokens),
            {**(metadata if first else {}), "latency_ms": 100.0 * (seq + 1)}, head if first else None,
        )  # fmt: skip
        assert stream_parts_write([part]) == set()
    return interaction_id


def _feedback(tenant, interaction_id, outcome="accepted"):
    (result,) = feedback_ingest(tenant, items=[{"interaction_id": str(interaction_id), "outcome": outcome}])
    return result


def test_an_open_stream_is_no_interaction_and_its_feedback_waits_out_of_training(adapter):
    interaction_id = _open_stream(adapter, [(" a", [10]), (" b", [11])])
    assert _feedback(adapter.tenant, interaction_id).status == "pending"
    assert not Interaction.objects.filter(pk=interaction_id).exists()
    assert Feedback.objects.get(tenant=adapter.tenant).interaction_id is None
    assert not training_events_eligible(adapter, parent=None).exists()
    # An id no stream served is still not found.
    assert _feedback(adapter.tenant, uuid.uuid4()).status == "rejected"


def test_the_sweeper_records_a_stale_stream_as_partial_with_its_feedback_out_of_training(adapter):
    interaction_id = _open_stream(adapter, [(" a", [10]), (" b", [11, 12])])
    _feedback(adapter.tenant, interaction_id, "rejected")
    assert stream_parts_sweep() == 0  # written just now: its worker may still be serving it
    assert stream_parts_sweep(now=timezone.now() + timedelta(minutes=3)) == 1
    recorded = Interaction.objects.get(pk=interaction_id)
    assert (recorded.completion, recorded.completion_token_ids) == (" a b", [10, 11, 12])
    assert recorded.completion_logprobs == [-0.5] * 3 and recorded.latency_ms == 200.0
    assert recorded.metadata["partial"] is True and recorded.metadata["finish_reason"] is None
    assert recorded.metadata["temperature"] == 0.2
    assert not StreamPart.objects.exists()
    assert [f.outcome for f in recorded.feedback.all()] == ["rejected"]
    # Recorded, yet never trained on: the feedback judged the whole text the user saw, the row holds
    # only what was written before its worker died.
    assert not training_events_eligible(adapter, parent=None).exists()


def test_a_stale_stream_with_a_minus_infinity_logprob_is_recorded_without_logprobs(adapter):
    interaction_id = uuid.uuid4()
    head, metadata = stream_part_head(served_rows(adapter.tenant, **_fields(adapter, interaction_id))[0])
    part = Part(adapter.tenant_id, interaction_id, 0, " a", [10, 11], [-0.5, float("-inf")], metadata, head)
    assert stream_parts_write([part]) == set()  # the part's JSON holds the -inf as null
    assert stream_parts_sweep(now=timezone.now() + timedelta(minutes=3)) == 1
    recorded = Interaction.objects.get(pk=interaction_id)
    assert recorded.completion_token_ids == [10, 11] and recorded.completion_logprobs == []
    assert recorded.prompt_token_ids == [1, 2]


def test_a_stale_stream_the_sweeper_cannot_record_is_dropped_after_an_hour_and_its_feedback_kept(adapter):
    poison = _open_stream(adapter, [(" a", [10])])
    StreamPart.objects.filter(interaction_id=poison).update(head={"id": str(poison)})  # a bug: unreadable
    _feedback(adapter.tenant, poison)
    assert stream_parts_sweep(now=timezone.now() + timedelta(minutes=3)) == 0
    assert StreamPart.objects.filter(interaction_id=poison).exists()  # tried again by the next sweep
    assert stream_parts_sweep(now=timezone.now() + timedelta(minutes=61)) == 0
    assert not StreamPart.objects.exists()  # never again at the front of the sweep
    assert Feedback.objects.filter(tenant=adapter.tenant, pending_client_id=str(poison)).exists()


def test_the_sweeper_joins_a_stale_streams_tool_calls_from_what_each_part_added(adapter):
    interaction_id = _open_stream(adapter, [("", [10]), ("", [11])])
    deltas = [
        [{"index": 0, "id": "call_1", "name": "f", "arguments": '{"x": '}],
        [{"index": 0, "arguments": "1}"}, {"index": 1, "id": "call_2", "name": "g", "arguments": "{}"}],
    ]
    for seq, since in enumerate(deltas):
        part = StreamPart.objects.get(interaction_id=interaction_id, seq=seq)
        part.metadata = {**part.metadata, "tool_calls_since": since}
        part.save()
    stream_parts_sweep(now=timezone.now() + timedelta(minutes=3))
    metadata = Interaction.objects.get(pk=interaction_id).metadata
    assert metadata["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    assert "tool_calls_since" not in metadata


def test_a_streams_end_records_it_whole_over_its_parts_and_attaches_the_feedback(adapter):
    interaction_id = _open_stream(adapter, [(" a", [10])])
    _feedback(adapter.tenant, interaction_id)
    fields = _fields(adapter, interaction_id, " a b", [10, 11], finish="length")
    interactions_record_served(adapter.tenant, stream_parts=True, **fields)
    recorded = Interaction.objects.get(pk=interaction_id)
    assert recorded.completion == " a b" and "partial" not in recorded.metadata
    assert [f.outcome for f in recorded.feedback.all()] == ["accepted"]
    assert not StreamPart.objects.exists()
    assert [e.interaction_id for e in training_events_eligible(adapter, parent=None)] == [interaction_id]


def _partial_accept(tenant, interaction_id, accepted_chars: int):
    item = {"interaction_id": str(interaction_id), "outcome": "partial", "accepted_chars": accepted_chars}
    (result,) = feedback_ingest(tenant, items=[item])
    return result


def test_a_partial_accept_that_waited_is_kept_whatever_the_completion_it_is_attached_to(adapter):
    fits, too_long = _open_stream(adapter, [(" a", [10])]), _open_stream(adapter, [(" a", [10])])
    assert _partial_accept(adapter.tenant, fits, 3).status == "pending"  # the completion is not known yet
    assert _partial_accept(adapter.tenant, too_long, 4).status == "pending"
    for interaction_id in (fits, too_long):
        fields = _fields(adapter, interaction_id, " a b", [10, 11], finish="length")  # 4 characters
        interactions_record_served(adapter.tenant, stream_parts=True, **fields)
    assert Feedback.objects.get(interaction_id=fits).accepted_chars == 3
    # Kept, as pending feedback always is: its token credit keeps the whole completion
    # (tests/training/test_token_credit.py).
    assert Feedback.objects.get(interaction_id=too_long).accepted_chars == 4


def test_a_partial_accept_longer_than_a_partial_interaction_is_kept_out_of_training(adapter):
    interaction_id = _open_stream(adapter, [(" a", [10])])
    _partial_accept(adapter.tenant, interaction_id, 3)  # the user saw more than the last write held
    stream_parts_sweep(now=timezone.now() + timedelta(minutes=3))
    assert Feedback.objects.get(interaction_id=interaction_id).accepted_chars == 3  # its outcome counts
    assert not training_events_eligible(adapter, parent=None).exists()


def test_a_streams_end_after_the_sweeper_completes_it_and_merges_the_metadata(adapter):
    interaction_id = _open_stream(adapter, [(" a", [10])])
    stream_parts_sweep(now=timezone.now() + timedelta(minutes=3))  # stalled past the sweeper, then resumed
    Interaction.objects.filter(pk=interaction_id).update(metadata={"partial": True, "temperature": 0.2, "other": 1})
    fields = _fields(adapter, interaction_id, " a b", [10, 11], finish="length", metadata={"temperature": 0.2})
    interactions_record_served(adapter.tenant, stream_parts=True, **fields)
    recorded = Interaction.objects.get(pk=interaction_id)
    assert recorded.completion == " a b" and recorded.completion_token_ids == [10, 11]
    assert recorded.metadata == {"temperature": 0.2, "other": 1, "finish_reason": "length"}  # merged, not replaced


def test_a_streams_end_merges_one_level_and_keeps_a_null_on_either_database(adapter):
    # As Postgres's ``||``: a null set by the stream's end stays (SQLite's json_patch() would delete
    # it), and an object it sets replaces the stored one (json_patch() would merge the two).
    interaction_id = _open_stream(adapter, [(" a", [10])])
    stream_parts_sweep(now=timezone.now() + timedelta(minutes=3))
    stored = {"partial": True, "finish_reason": "stop", "nested": {"a": 1, "b": 2}, "other": 1}
    Interaction.objects.filter(pk=interaction_id).update(metadata=stored)
    fields = _fields(adapter, interaction_id, " a b", [10, 11], metadata={"nested": {"a": 5}})  # finish_reason: None
    interactions_record_served(adapter.tenant, stream_parts=True, **fields)
    recorded = Interaction.objects.get(pk=interaction_id)
    assert recorded.metadata == {"finish_reason": None, "nested": {"a": 5}, "other": 1}


def test_a_streams_end_never_touches_another_tenants_row_with_the_same_id(adapter, make_tenant, tiny_starter_model):
    # The upsert's tenant wall, on whichever database the suite runs (Postgres by its WHERE, SQLite by
    # its read-merge-write): an id already recorded for one tenant is left as it was by another's end.
    interaction_id = uuid.uuid4()
    interactions_record_served(
        adapter.tenant, stream_parts=True, **_fields(adapter, interaction_id, " mine", [10], metadata={"owner": "a"})
    )
    other_tenant = make_tenant()
    EndUser.objects.create(tenant=other_tenant, external_id="u1", opted_in=True)
    base = base_model_register(name="base-b", path=tiny_starter_model)
    other = adapter_create(other_tenant, name="tab", base_model=base, is_default=True)
    interactions_record_served(
        other_tenant, stream_parts=True, **_fields(other, interaction_id, " theirs", [11], metadata={"owner": "b"})
    )
    row = Interaction.objects.get(pk=interaction_id)
    assert (row.tenant_id, row.completion, row.completion_token_ids) == (adapter.tenant_id, " mine", [10])
    assert row.metadata.get("owner") == "a"
    assert not Interaction.objects.filter(tenant=other_tenant).exists()


def test_a_stale_stream_given_up_on_is_a_serving_failure_through_which_the_erase_finds_its_feedback(adapter):
    poison = _open_stream(adapter, [(" a", [10]), (" b", [11])])
    StreamPart.objects.filter(interaction_id=poison, seq=1).update(  # a bug: a tool call's delta without its index
        metadata={"tool_calls_since": [{"arguments": "{"}]}
    )
    _feedback(adapter.tenant, poison)
    assert stream_parts_sweep(now=timezone.now() + timedelta(minutes=61)) == 0
    assert not StreamPart.objects.exists()
    failure = ServingFailure.objects.get()
    assert (failure.stream_ids, failure.end_user_id, failure.adapter_id) == ([str(poison)], "u1", adapter.pk)
    assert failure.streamed and failure.kind == "server_error"
    report = end_user_erase(adapter.tenant, external_id="u1", actor="test")
    assert report.deleted["pending_feedback"] == 1 and report.deleted["serving_failures"] == 1
    assert not Feedback.objects.exists()


def test_a_stream_that_fails_after_a_write_keeps_its_feedback(adapter):
    interaction_id = _open_stream(adapter, [(" a", [10])])
    _feedback(adapter.tenant, interaction_id)
    route = Route(adapter=adapter, version=None)
    error = ApplicationError("vLLM went away", code="upstream_error")
    error.status_code = 502
    serving_failure_record(
        adapter.tenant, route=route, user="u1", error=error, started=0.0, streamed=True, stream_parts=[interaction_id]
    )
    assert not Interaction.objects.filter(pk=interaction_id).exists()  # a failure, never half an interaction
    assert not StreamPart.objects.exists()  # nor later, by the sweeper
    assert Feedback.objects.filter(tenant=adapter.tenant, pending_client_id=str(interaction_id)).exists()


def test_the_erase_finds_the_feedback_waiting_on_a_stream_vllm_failed(adapter):
    interaction_id = _open_stream(adapter, [(" a", [10])])
    _feedback(adapter.tenant, interaction_id)
    error = ApplicationError("vLLM went away", code="upstream_error")
    error.status_code = 502
    serving_failure_record(
        adapter.tenant,
        route=Route(adapter=adapter, version=None),
        user="u1",
        error=error,
        started=0.0,
        streamed=True,
        stream_parts=[interaction_id],
    )
    assert ServingFailure.objects.get().stream_ids == [str(interaction_id)]
    report = end_user_erase(adapter.tenant, external_id="u1", actor="test")
    assert report.deleted["pending_feedback"] == 1 and report.deleted["serving_failures"] == 1
    assert not Feedback.objects.exists()


def test_one_bad_part_costs_no_other_part_of_its_write(adapter):
    good = [Part(adapter.tenant_id, uuid.uuid4(), 0, " a", [1], [-0.1], {}, {}) for _ in range(2)]
    bad = Part(adapter.tenant_id, uuid.uuid4(), -1, " x", [1], [-0.1], {}, {})  # seq below 0: refused
    assert stream_parts_write([good[0], bad, good[1]]) == {1}
    assert set(StreamPart.objects.values_list("interaction_id", flat=True)) == {
        good[0].interaction_id,
        good[1].interaction_id,
    }


def test_a_part_that_is_no_json_costs_no_other_part_of_its_write(adapter):
    parts = [Part(adapter.tenant_id, uuid.uuid4(), 0, " a", [1], [-0.1], {}, {}) for _ in range(3)]
    parts[1].metadata = {"not json": object()}  # a bug upstream: no DatabaseError, yet only this part fails
    assert stream_parts_write(parts) == {1}
    assert set(StreamPart.objects.values_list("interaction_id", flat=True)) == {
        parts[0].interaction_id,
        parts[2].interaction_id,
    }


def test_a_part_written_again_replaces_its_seq(adapter):
    part = Part(adapter.tenant_id, uuid.uuid4(), 0, " a", [1], [-0.1], {}, {})
    stream_parts_write([part])
    stream_parts_write([Part(part.tenant_id, part.interaction_id, 0, " a b", [1, 2], [-0.1, -0.2], {}, {})])
    assert StreamPart.objects.get().completion == " a b"


def test_erasing_an_end_user_drops_their_open_streams_and_the_feedback_waiting_on_them(adapter):
    interaction_id = _open_stream(adapter, [(" a", [10])])
    _feedback(adapter.tenant, interaction_id)
    assert end_user_erase_preview(adapter.tenant, external_id="u1")["deleted"]["pending_feedback"] == 1
    report = end_user_erase(adapter.tenant, external_id="u1", actor="test")
    assert report.deleted["pending_feedback"] == 1
    assert not StreamPart.objects.exists() and not Feedback.objects.exists()
    assert stream_parts_sweep(now=timezone.now() + timedelta(minutes=3)) == 0  # nothing comes back


def test_an_editor_key_sends_feedback_only_on_the_open_streams_it_served(adapter):
    interaction_id = uuid.uuid4()
    row = served_rows(adapter.tenant, **_fields(adapter, interaction_id, metadata={"api_key_prefix": "ed1"}))[0]
    head, metadata = stream_part_head(row)
    stream_parts_write([Part(adapter.tenant_id, interaction_id, 0, " a", [10], [-0.5], metadata, head)])
    item = {"interaction_id": str(interaction_id), "outcome": "accepted"}
    (other,) = feedback_ingest(adapter.tenant, items=[item], served_by="ed2")
    assert other.status == "rejected" and other.error["code"] == "not_found"
    (own,) = feedback_ingest(adapter.tenant, items=[item], served_by="ed1")
    assert own.status == "pending"
