"""The window of a run: which labelled events it learns from, with which rewards and tokens."""

from __future__ import annotations

import pytest

from apps.adapters.models import AdapterVersion
from apps.interactions.models import Feedback, Interaction
from apps.training import selectors
from apps.training.dataset import dataset_export, interaction_to_sample
from apps.training.models import TrainingPolicy, TrainingRun, TrainingRunEvent
from apps.training.selectors import training_events_eligible, training_events_new, training_window_events

pytestmark = pytest.mark.django_db


def make_run(adapter, parent=None, status="exporting"):
    return TrainingRun.objects.create(tenant=adapter.tenant, adapter=adapter, parent_version=parent, status=status)


def test_only_opted_in_labelled_events_are_eligible(tiny_adapter, add_events):
    opted = add_events(4)
    add_events(3, opted_in=False)
    Interaction.objects.create(  # labelled? no: an interaction without feedback is not an event
        tenant=tiny_adapter.tenant,
        client_id="unlabelled",
        source="logged",
        prompt="p",
        completion="c",
        served_at="2026-11-21T10:00:00Z",
        received_at="2026-11-21T10:00:00Z",
        end_user_opted_in=True,
    )
    eligible = training_events_eligible(tiny_adapter, parent=None)
    assert sorted(str(f.interaction_id) for f in eligible) == sorted(opted)


def test_rewards_follow_the_tenants_policy(tiny_adapter, add_events):
    add_events(4)
    policy = TrainingPolicy.objects.get(adapter=tiny_adapter)
    policy.heldout_fraction = 0.0
    policy.reward_rejected = -1.0
    policy.save()
    window = dataset_export(make_run(tiny_adapter), policy=policy)
    by_outcome = {Feedback.objects.get(interaction_id=s.id).outcome: s.reward for s in window.train}
    assert by_outcome == {"accepted": 0.75, "rejected": -1.0, "not_shown": 0.0, "edited": 0.25}


def test_served_token_ids_and_logprobs_are_used_as_served(tiny_adapter, add_events):
    (interaction_id,) = add_events(1)
    interaction = Interaction.objects.get(pk=interaction_id)
    sample = interaction_to_sample(interaction, base=tiny_adapter.base_model, reward=1.0)
    assert list(sample.completion_token_ids) == interaction.completion_token_ids
    assert list(sample.behaviour_logprobs) == interaction.completion_logprobs


def test_a_served_completion_cut_to_no_text_is_exported_as_silent(tiny_adapter, add_events):
    """A stop string that cut the completion at its first token showed nothing: the sample says so,
    so the trainer knows that token as one of this tenant's ways of staying silent."""
    (interaction_id,) = add_events(1)
    interaction = Interaction.objects.get(pk=interaction_id)
    assert interaction.completion.strip()
    assert interaction_to_sample(interaction, base=tiny_adapter.base_model, reward=1.0).silent is False
    interaction.completion, interaction.completion_token_ids, interaction.completion_logprobs = "", [198], [-2.0]
    sample = interaction_to_sample(interaction, base=tiny_adapter.base_model, reward=0.0)
    assert sample.silent is True and list(sample.completion_token_ids) == [198]


def test_logged_text_without_ids_is_tokenized_with_the_fim_prompt(tiny_adapter, tiny_starter_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_starter_model)
    interaction = Interaction(
        tenant=tiny_adapter.tenant,
        prefix="def f():\n    ",
        suffix="\n",
        completion="return 1",
        completion_token_ids=[10**6],
        completion_logprobs=[-0.1],
    )
    sample = interaction_to_sample(interaction, base=tiny_adapter.base_model, reward=0.5)
    assert list(sample.prompt_token_ids)[0] == tokenizer.convert_tokens_to_ids("<|fim_prefix|>")
    assert tokenizer.decode(list(sample.completion_token_ids)) == "return 1"
    assert sample.behaviour_logprobs is None  # ids from another vocabulary: their logprobs mean nothing here


@pytest.mark.parametrize(
    "prompt",
    ["<fim_prefix>def f():\n    <fim_suffix>\n<fim_middle>", "def f():\n    "],
    ids=["another-convention", "openai-insert-form"],
)
def test_a_fim_request_sent_in_another_form_is_tokenized_in_the_bases_fim_frame(
    tiny_adapter, tiny_starter_model, prompt
):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_starter_model)
    interaction = Interaction(
        tenant=tiny_adapter.tenant,
        prompt=prompt,  # as the client sent it; prefix and suffix as Strop read them
        prefix="def f():\n    ",
        suffix="\n",
        completion="return 1",
        completion_token_ids=[10**6],
    )
    sample = interaction_to_sample(interaction, base=tiny_adapter.base_model, reward=0.5)
    assert list(sample.prompt_token_ids)[0] == tokenizer.convert_tokens_to_ids("<|fim_prefix|>")
    assert "<fim_prefix>" not in tokenizer.decode(list(sample.prompt_token_ids))


def test_a_plain_prompt_without_ids_is_tokenized_as_it_was_sent(tiny_adapter, tiny_starter_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_starter_model)
    interaction = Interaction(
        tenant=tiny_adapter.tenant, prompt="# add two numbers\n", completion="x", completion_token_ids=[10**6]
    )
    sample = interaction_to_sample(interaction, base=tiny_adapter.base_model, reward=0.5)
    assert tokenizer.decode(list(sample.prompt_token_ids)) == "# add two numbers\n"


def test_a_lineage_never_trains_on_an_event_twice_and_skips_none(tiny_adapter, add_events):
    policy = TrainingPolicy.objects.get(adapter=tiny_adapter)
    first_events = add_events(8)
    run1 = make_run(tiny_adapter)
    window1 = dataset_export(run1, policy=policy)
    assert len(window1.train) + len(window1.heldout) == 8
    version = AdapterVersion.objects.create(
        tenant=tiny_adapter.tenant,
        adapter=tiny_adapter,
        number=1,
        artifact_path="/x/v1",
        vllm_name="x--v1",
        status="candidate",
    )
    TrainingRun.objects.filter(pk=run1.pk).update(status="candidate", output_version=version)
    later_events = add_events(5)  # arrived while run 1 trained
    eligible = {str(f.interaction_id) for f in training_events_eligible(tiny_adapter, parent=version)}
    trained1 = {s.id for s in window1.train}
    held1 = {s.id for s in window1.heldout}
    assert eligible == set(later_events) | held1  # held-out events are not consumed
    assert not eligible & trained1
    assert set(first_events) <= trained1 | held1


def test_events_seen_by_a_rejected_run_do_not_trigger_again(tiny_adapter, add_events):
    add_events(8)
    run = make_run(tiny_adapter)
    dataset_export(run, policy=TrainingPolicy.objects.get(adapter=tiny_adapter))
    TrainingRun.objects.filter(pk=run.pk).update(status="rejected")
    assert training_events_new(tiny_adapter, parent=None).count() == 0
    assert training_events_eligible(tiny_adapter, parent=None).count() == 8  # still learnable by the next run


def test_another_tenants_events_never_enter_a_window(tiny_adapter, add_events, make_tenant):
    other = make_tenant("other")
    add_events(5, tenant_=other)
    assert training_events_eligible(tiny_adapter, parent=None).count() == 0


def test_the_window_scores_shown_served_completions_for_the_show_gate(tiny_adapter, add_events):
    """What the show filter is fitted on: served completions the user saw, scored by their own logprobs,
    an explored one weighed as serving recorded it; not what was not shown, logged or withheld."""
    from apps.training.pipeline import _fit_show_filter, silence_gated

    ids = add_events(24)  # outcomes cycle accepted, rejected, not_shown, edited
    for k, interaction_id in enumerate(ids):
        Interaction.objects.filter(pk=interaction_id).update(
            source="served",
            completion_logprobs=[-0.1 * (k % 4), -0.2],
            metadata={"show_gate": {"withheld": False, "explored": True, "weight": 20.0}} if k == 0 else {},
        )
    add_events(4)  # logged, not served: never scored
    policy = TrainingPolicy.objects.get(adapter=tiny_adapter)
    policy.heldout_fraction = 0.0
    first = make_run(tiny_adapter)
    window = dataset_export(first, policy=policy)
    by_score = sorted((round(e.score, 4), e.accepted, e.weight) for e in window.show_events)
    assert by_score == sorted(
        [(-0.2, True, 20.0)] + [(-0.2, True, 1.0)] * 5 + [(-0.3, False, 1.0)] * 6 + [(-0.5, False, 1.0)] * 6
    )
    assert _fit_show_filter(window, policy) is None  # 6 accepted: too few to place a threshold
    # No filter to stay silent for it: the trainer teaches completions silence itself.
    assert silence_gated(_fit_show_filter(window, policy)) is False
    # Grouped by end user: the fit checks itself on users it was not fitted on.
    assert {e.group for e in window.show_events} == {f"dev-{k}" for k in range(5)}
    TrainingRun.objects.filter(pk=first.pk).update(status="rejected")
    add_events(40)
    Interaction.objects.filter(source="logged").update(source="served")
    second = make_run(tiny_adapter)
    window = dataset_export(second, policy=policy)
    fitted = _fit_show_filter(window, policy)
    assert fitted["threshold"] == pytest.approx(-1.5) and fitted["explore"] == 0.05 and fitted["recall"] == 0.95
    assert fitted["fit_recall"] >= 0.95 and fitted["window_recall"] >= 0.95 and "check_recall" in fitted
    assert silence_gated(fitted) is True  # the filter stays silent for completions
    policy.show_gate = False
    assert _fit_show_filter(window, policy) is None
    assert silence_gated(_fit_show_filter(window, policy)) is False
    TrainingRun.objects.filter(pk=second.pk).update(status="rejected")
    policy.heldout_fraction = 1.0  # what the eval gate judges the version on is never what its gate was fitted on
    held = dataset_export(make_run(tiny_adapter), policy=policy)
    assert held.heldout and not held.show_events


def test_a_windows_walk_in_steps_takes_the_oldest_eligible_events_whatever_the_step(
    tiny_adapter, add_events, make_tenant, monkeypatch
):
    # Eligible events interleaved with ineligible ones (opted out) and another tenant's, some already
    # trained in the lineage: the walk, in steps of 3 ids, takes the same events as one query would.
    other = make_tenant()
    for _ in range(4):
        add_events(3)
        add_events(2, opted_in=False)
        add_events(2, tenant_=other)
    parent = AdapterVersion.objects.create(
        tenant=tiny_adapter.tenant,
        adapter=tiny_adapter,
        number=1,
        artifact_path="/x",
        vllm_name="p",
        status="production",
    )
    trained = make_run(tiny_adapter, status="succeeded")
    TrainingRun.objects.filter(pk=trained.pk).update(output_version=parent)
    oldest = list(training_events_eligible(tiny_adapter, parent=None).order_by("id")[:4])
    TrainingRunEvent.objects.bulk_create(
        [TrainingRunEvent(run=trained, feedback=f, held_out=False, reward=0.0) for f in oldest]
    )
    monkeypatch.setattr(selectors, "WINDOW_STEP", 3)
    expected = [f.pk for f in training_events_eligible(tiny_adapter, parent=parent).order_by("id")]
    assert len(expected) == 8
    for limit in (1, 5, 8, 50, None):
        window = training_window_events(tiny_adapter, parent=parent, limit=limit)
        assert [f.pk for f in window] == expected[:limit]
        assert all(f.interaction.tenant_id == tiny_adapter.tenant_id for f in window)
