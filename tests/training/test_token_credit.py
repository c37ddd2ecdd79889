"""The exporter's token-level credit: a partial accept or an edit rewards the served tokens the user
kept, penalises the first one they did not, and gives the rest nothing; on the tiny starter model's
tokenizer, and through the trainer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from apps.interactions.models import Feedback, Interaction
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.dataset import dataset_export, show_event
from apps.training.models import TrainingRun
from gpu_trainer.config import PPOConfig
from gpu_trainer.ppo import train_ppo
from tests.gpu_trainer.helpers import FIM_PROMPT_TEXT, completion_logprobs, load

pytestmark = pytest.mark.django_db

A, R = 0.75, -0.25  # the policy's accepted and rejected rewards (defaults)
COMPLETION = "return a + b"  # the tiny model's tokens: "return" [0, 6), " a" [6, 8), " +" [8, 10), " b" [10, 12)


@pytest.fixture
def tokenizer(tiny_starter_model):
    return AutoTokenizer.from_pretrained(str(tiny_starter_model))


@pytest.fixture
def serve(tenant, tokenizer):
    """``serve(client_id, completion=COMPLETION)``: a completion served with the tiny model's own tokens."""

    def serve(client_id: str, completion: str = COMPLETION, logprobs: list[float] | None = None) -> list[int]:
        ids = tokenizer.encode(completion, add_special_tokens=False)
        item = {
            "client_id": client_id,
            "prompt": FIM_PROMPT_TEXT,
            "completion": completion,
            "prompt_token_ids": tokenizer.encode(FIM_PROMPT_TEXT),
            "completion_token_ids": ids,
            "completion_logprobs": logprobs or [-1.0] * len(ids),
            "end_user_id": "dev-1",
            "opted_in": True,
        }
        (result,) = interactions_ingest(tenant, items=[item])
        assert result.status == "created"
        return ids

    return serve


def export(tiny_adapter, policy) -> dict[str, dict]:
    run = TrainingRun.objects.create(tenant=tiny_adapter.tenant, adapter=tiny_adapter, status="exporting")
    window = dataset_export(run, policy=policy)
    assert not window.heldout
    return {Feedback.objects.get(interaction_id=s.id).interaction.client_id: s for s in window.train}


def label(tenant, client_id: str, outcome: str, **fields) -> None:
    (result,) = feedback_ingest(tenant, items=[{"client_id": client_id, "outcome": outcome, **fields}])
    assert result.status in ("recorded", "pending"), result.error


@pytest.mark.parametrize(
    ("accepted_chars", "token_rewards"),
    [
        (1, [R, 0.0, 0.0, 0.0]),  # inside "return": no token is whole, the first is refused
        (6, [A, R, 0.0, 0.0]),
        (7, [A, R, 0.0, 0.0]),  # "return " holds half of " a"
        (8, [A, A, R, 0.0]),  # "return a"
        (9, [A, A, R, 0.0]),
        (11, [A, A, A, R]),  # all but " b"
    ],
)
def test_a_partial_accept_credits_the_tokens_inside_the_accepted_characters(
    tiny_adapter, policy, serve, tenant, accepted_chars, token_rewards
):
    serve("p")
    label(tenant, "p", "partial", accepted_chars=accepted_chars)
    sample = export(tiny_adapter, policy)["p"]
    assert list(sample.token_rewards) == token_rewards
    assert sample.reward == policy.reward_partial == 0.25  # the scalar stays the policy's for the outcome


@pytest.mark.parametrize(
    ("kept_text", "token_rewards"),
    [
        ("return a - b", [A, A, R, 0.0]),  # common prefix "return a "
        ("return a+b", [A, A, R, 0.0]),
        ("return b", [A, R, 0.0, 0.0]),
        ("x = 1", [R, 0.0, 0.0, 0.0]),  # shares nothing: a rejection of the first token
        ("", [R, 0.0, 0.0, 0.0]),
        (COMPLETION, [A, A, A, A]),
        (COMPLETION + "  # sum", [A, A, A, A]),
    ],
)
def test_an_edit_credits_the_tokens_of_its_common_prefix_with_the_kept_text(
    tiny_adapter, policy, serve, tenant, kept_text, token_rewards
):
    serve("e")
    label(tenant, "e", "edited", kept_text=kept_text)
    sample = export(tiny_adapter, policy)["e"]
    assert list(sample.token_rewards) == token_rewards
    assert sample.reward == policy.reward_edited


@pytest.mark.parametrize(
    ("kept_text", "preferred"),
    [
        ("return a - b", "return a - b"),
        (COMPLETION + "  # sum", COMPLETION + "  # sum"),
        (COMPLETION, None),  # kept as it was: nothing preferred to it
        (COMPLETION + "\n", None),
        ("", None),
    ],
)
def test_an_edit_carries_its_kept_text_as_the_preferred_continuation(
    tiny_adapter, policy, serve, tenant, tokenizer, kept_text, preferred
):
    serve("e")
    serve("p")
    label(tenant, "e", "edited", kept_text=kept_text)
    label(tenant, "p", "partial", accepted_chars=3)
    samples = export(tiny_adapter, policy)
    expected = None if preferred is None else tuple(tokenizer.encode(preferred, add_special_tokens=False))
    assert samples["e"].preferred_token_ids == expected
    assert samples["p"].preferred_token_ids is None


def test_token_credit_follows_the_policys_rewards_and_other_outcomes_carry_none(tiny_adapter, policy, serve, tenant):
    policy.reward_accepted, policy.reward_rejected, policy.reward_partial = 1.0, -2.0, 0.5
    policy.save()
    for name, outcome in (("p", "partial"), ("a", "accepted"), ("r", "rejected"), ("n", "not_shown")):
        serve(name)
        label(tenant, name, outcome, **({"accepted_chars": 8} if outcome == "partial" else {}))
    samples = export(tiny_adapter, policy)
    assert list(samples["p"].token_rewards) == [1.0, 1.0, -2.0, 0.0] and samples["p"].reward == 0.5
    assert {name: samples[name].token_rewards is not None for name in "arn"} == {"a": False, "r": False, "n": False}
    assert [samples[name].reward for name in "arn"] == [1.0, -2.0, 0.0]


def test_a_token_holding_part_of_a_character_is_kept_only_with_the_whole_character(
    tiny_adapter, policy, serve, tenant, tokenizer
):
    """Byte-level tokens split "€" and "😀": the user took "é€", so every token up to the last byte
    of "€" is kept and the first byte of "😀" is the one refused."""
    ids = serve("u", completion="é€😀 x")
    prefixes = [tokenizer.decode(ids[: k + 1]) for k in range(len(ids))]
    first_of_emoji = next(k for k, text in enumerate(prefixes) if len(text) > 2)
    assert prefixes[first_of_emoji - 1] == "é€" and prefixes[first_of_emoji].startswith("é€\ufffd")
    label(tenant, "u", "partial", accepted_chars=2)
    rewards = list(export(tiny_adapter, policy)["u"].token_rewards)
    assert rewards == [A] * first_of_emoji + [R] + [0.0] * (len(ids) - first_of_emoji - 1)


def test_a_pending_partial_accept_that_covers_the_whole_completion_keeps_all_of_it(tiny_adapter, policy, serve, tenant):
    label(tenant, "late", "partial", accepted_chars=40)  # its completion is not known yet: kept pending
    serve("late")
    assert list(export(tiny_adapter, policy)["late"].token_rewards) == [A, A, A, A]


def test_the_show_gate_counts_only_a_whole_accept_as_accepted(tiny_adapter, serve, tenant):
    """A partial accept or an edit is shown and not accepted, for the gate as in the accept rate."""
    for name, outcome, fields in (("p", "partial", {"accepted_chars": 3}), ("e", "edited", {"kept_text": "x"})):
        serve(name)
        label(tenant, name, outcome, **fields)
    Interaction.objects.update(source=Interaction.Source.SERVED)
    events = {f.interaction.client_id: show_event(f) for f in Feedback.objects.select_related("interaction")}
    assert (events["p"].accepted, events["e"].accepted) == (False, False)


def test_edits_train_toward_the_kept_text_through_the_exporter(
    tiny_adapter, policy, serve, tenant, tiny_starter_model, tmp_path
):
    """Developers kept "return a " of "return a + b" and typed "- b": exported and trained, the
    kept tokens ("return", " a") rise and the first diverging one (" +") falls, against the base
    model that served them. All events are edits (one scalar reward), so without token credit
    every advantage would be 0. Margins: here (seed 0) the kept tokens rose by 1.27 and 1.17 nats
    and " +" fell by 0.58; seeds 0-2 of the same samples made by hand (tests/gpu_trainer) moved
    them by 0.8-1.6 and 0.58-0.85."""
    prompt = AutoTokenizer.from_pretrained(str(tiny_starter_model)).encode(FIM_PROMPT_TEXT)
    base_model = load(tiny_starter_model)
    ids = AutoTokenizer.from_pretrained(str(tiny_starter_model)).encode(COMPLETION, add_special_tokens=False)
    before = completion_logprobs(base_model, prompt, ids)
    for n in range(8):
        serve(f"e-{n}", logprobs=before)  # served by the base model: its own log-probs
        label(tenant, f"e-{n}", "edited", kept_text="return a - b")
    samples = list(export(tiny_adapter, policy).values())
    assert all(list(s.token_rewards) == [A, A, R, 0.0] for s in samples) and len(samples) == 8
    config = PPOConfig(learning_rate=5e-3, epochs=4, num_minibatches=2, target_kl=None, silence_counterfactual=False)
    result = train_ppo(config, samples, base_model_dir=tiny_starter_model, out_dir=tmp_path / "out", progress=False)
    after = completion_logprobs(load(tiny_starter_model, result.out_dir), prompt, ids)
    assert after[0] > before[0] + 0.3 and after[1] > before[1] + 0.3, (before, after)
    assert after[2] < before[2] - 0.2, (before, after)
    assert result.summary["token_credit_samples"] == 8
