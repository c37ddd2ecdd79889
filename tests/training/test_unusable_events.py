"""One event no sample can be built from never fails its window, nor starts run after run: a stored
empty prompt id list is tokenized from the prompt's text (or, with no text, has nothing to learn),
and anything else unusable is left out of the samples, named, and recorded as looked at."""

from __future__ import annotations

import pytest

from apps.interactions.models import Feedback, Interaction
from apps.training.dataset import dataset_export
from apps.training.models import TrainingPolicy, TrainingRun, TrainingRunEvent
from apps.training.selectors import training_events_eligible, training_events_new
from apps.training.services import training_schedule


def make_run(adapter):
    return TrainingRun.objects.create(tenant=adapter.tenant, adapter=adapter, status="exporting")


@pytest.mark.django_db
def test_a_stored_empty_prompt_id_list_is_tokenized_from_the_prompt_text(tiny_adapter, policy, add_events):
    from transformers import AutoTokenizer

    ids = add_events(4)
    Interaction.objects.filter(pk=ids[0]).update(prompt_token_ids=[])  # as ingest took it before refusing it
    window = dataset_export(make_run(tiny_adapter), policy=policy)
    assert len(window.train) == 4 and not window.left_out
    (sample,) = [s for s in window.train if s.id == ids[0]]
    tokenizer = AutoTokenizer.from_pretrained(tiny_adapter.base_model.path)
    prompt = Interaction.objects.get(pk=ids[0]).prompt
    assert list(sample.prompt_token_ids) == tokenizer.encode(prompt, add_special_tokens=False)


@pytest.mark.django_db
def test_an_event_with_empty_prompt_ids_and_no_prompt_text_has_nothing_to_learn(tiny_adapter, add_events):
    ids = add_events(3)
    Interaction.objects.filter(pk=ids[0]).update(prompt="", prefix="", suffix="", prompt_token_ids=[])
    eligible = {str(f.interaction_id) for f in training_events_eligible(tiny_adapter, parent=None)}
    assert eligible == set(ids[1:])


@pytest.mark.django_db
def test_an_event_no_sample_can_be_built_from_is_left_out_of_the_samples_and_not_new_again(
    tiny_adapter, policy, add_events
):
    ids = add_events(4)
    Interaction.objects.filter(pk=ids[1]).update(completion_logprobs=[0.5, -1.0])  # not a log-probability
    run = make_run(tiny_adapter)
    window = dataset_export(run, policy=policy)
    assert sorted(s.id for s in window.train) == sorted(ids[:1] + ids[2:])
    (why,) = window.left_out
    assert why.startswith(f"interaction {ids[1]}: ") and "behaviour_logprobs[0]" in why
    unusable = TrainingRunEvent.objects.get(run=run, feedback__interaction_id=ids[1])
    assert unusable.held_out and unusable.left_out  # looked at, never learned
    assert TrainingRunEvent.objects.filter(run=run).count() == 4
    TrainingRun.objects.filter(pk=run.pk).update(status="failed")
    assert training_events_new(tiny_adapter, parent=None).count() == 0  # it starts no run of its own
    # Never taken again, in this lineage or another: it would sit at the front of every window.
    eligible = training_events_eligible(tiny_adapter, parent=None).values_list("interaction_id", flat=True)
    assert str(ids[1]) not in {str(i) for i in eligible}


@pytest.mark.django_db
def test_a_fault_that_is_not_the_events_fails_the_window_and_records_nothing(
    tiny_adapter, policy, add_events, monkeypatch
):
    """A missing model file (or the database, or memory) is not an event's data: the export fails
    whole, nothing is recorded as seen, and the events stay new for the run after the fix."""
    import apps.training.dataset as dataset

    add_events(3)

    def missing(path):
        raise FileNotFoundError(f"{path}/config.json")

    monkeypatch.setattr(dataset, "_vocab_size", missing)
    run = make_run(tiny_adapter)
    with pytest.raises(FileNotFoundError):
        dataset_export(run, policy=policy)
    assert not TrainingRunEvent.objects.filter(run=run).exists()
    assert training_events_new(tiny_adapter, parent=None).count() == 3


@pytest.mark.django_db(transaction=True)  # the run's heartbeat reads it from a connection of its own
def test_a_window_of_only_unusable_events_fails_once_and_starts_no_run_after_it(
    tiny_adapter, add_events, execute_run, settings, tmp_path
):
    settings.STROP_RUN_ROOT = tmp_path
    TrainingPolicy.objects.filter(adapter=tiny_adapter).update(max_wait_s=0)  # one waiting event is due at once
    (interaction_id,) = add_events(1)
    Interaction.objects.filter(pk=interaction_id).update(completion_logprobs=[0.5, -1.0])
    run = training_schedule(tiny_adapter)
    assert run is not None
    assert execute_run(run) == "failed"
    run.refresh_from_db()
    assert "1 could not be made into samples" in run.error
    assert f"interaction {interaction_id}: " in run.log
    assert TrainingRun.objects.filter(adapter=tiny_adapter).count() == 1  # its end scheduled no other run
    assert Feedback.objects.filter(interaction_id=interaction_id).exists()
