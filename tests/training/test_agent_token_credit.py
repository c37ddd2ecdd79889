"""An agent's ``edit_persisted`` with ``kept_text`` (the code still in the user's file) credits the
answer token by token: the tokens that persisted earn the policy's ``reward_edit_persisted``, the
others 0; on the tiny starter model's tokenizer, through the exporter and through the trainer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from apps.interactions.models import Feedback, Interaction
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.dataset import dataset_export, interaction_to_sample
from apps.training.models import TrainingRun
from gpu_trainer.config import PPOConfig
from gpu_trainer.ppo import train_ppo
from learning_shared.credit import persisted_chars, persisted_token_rewards, token_char_spans
from tests.gpu_trainer.helpers import completion_logprobs, load

pytestmark = pytest.mark.django_db

P = 0.75  # the policy's reward_edit_persisted (default)
ADD = "def add(a, b):\n    return a + b\n"
ANSWER = f"Here is the fix:\n```python\n{ADD}\ndef sub(a, b):\n    return a - b\n```\nBoth take two numbers."
# The tiny model's tokens of ANSWER: 15 of prose and the opening fence ("H" … "python", "\n"), 13 of
# the add function up to its last " b", "\n\n" (add's last newline and the blank line after it: half
# of it is not ADD), 14 of the sub function, 4 of the closing fence, 11 of prose.
ADD_TOKENS = range(15, 28)
SUB_TOKENS = range(29, 43)
N_TOKENS = 58


@pytest.fixture(scope="module")
def tokenizer(tiny_starter_model):
    return AutoTokenizer.from_pretrained(str(tiny_starter_model))


@pytest.fixture(scope="module")
def answer_ids(tokenizer) -> list[int]:
    ids = tokenizer.encode(ANSWER, add_special_tokens=False)
    assert len(ids) == N_TOKENS
    assert tokenizer.decode(ids[ADD_TOKENS.start : ADD_TOKENS.stop]) == ADD[:-1]
    assert tokenizer.decode(ids[ADD_TOKENS.stop]) == "\n\n"
    assert tokenizer.decode(ids[SUB_TOKENS.start : SUB_TOKENS.stop]) == "def sub(a, b):\n    return a - b\n"
    return ids


def persisted_only(persisted: range = ADD_TOKENS, reward: float = P) -> list[float]:
    return [reward if k in persisted else 0.0 for k in range(N_TOKENS)]


# ---- the credit function (learning_shared.credit), pure ----


def test_only_runs_of_three_characters_or_more_persist():
    assert persisted_chars("x = a + b", "y = a + c") == [False, True, True, True, True, True, True, True, False]
    assert persisted_chars("return a", "ra") == [False] * 8  # "r" and "a" line up by chance only
    assert persisted_chars("a+b", "a+b") == [True] * 3


def test_a_kept_text_of_200_characters_or_more_still_matches_its_common_characters():
    """No automatic junk: with it, SequenceMatcher would ignore the characters that make up more
    than 1% of a kept_text of 200 characters or more, and in a file of code that can be all of them."""
    loop = "for value in values:\n    total = total + value\n"
    text = f"Sum them:\n```python\n{loop}```"
    flags = persisted_chars(text, loop * 5)
    start = text.index(loop)
    assert flags[start : start + len(loop)] == [True] * len(loop)


def test_the_tokens_of_one_character_all_span_it(tokenizer):
    ids = tokenizer.encode("é€ x", add_special_tokens=False)
    text, spans = token_char_spans(ids, tokenizer=tokenizer)
    assert text == "é€ x" and len(ids) == 6  # é and € take 2 and 3 byte-level tokens
    assert spans == [(0, 1), (0, 1), (1, 2), (1, 2), (1, 2), (2, 4)]


def test_a_token_earns_the_reward_when_all_its_characters_persisted(tokenizer, answer_ids):
    rewards = persisted_token_rewards(answer_ids, ADD, tokenizer=tokenizer, persisted_reward=P)
    assert rewards == persisted_only()


def test_a_token_holding_part_of_a_character_persists_only_with_the_whole_character(tokenizer):
    ids = tokenizer.encode("x = '€€'", add_special_tokens=False)  # "x", " =", " '", 3 bytes, 3 bytes, "'"
    assert len(ids) == 10
    rewards = persisted_token_rewards(ids, "x = '€", tokenizer=tokenizer, persisted_reward=P)
    assert rewards == [P] * 6 + [0.0] * 4  # the bytes of the first "€" persisted, not those of the second


def test_a_token_that_writes_nothing_earns_nothing(tokenizer, answer_ids):
    ids = answer_ids + [tokenizer.eos_token_id]  # decoded without special tokens: no characters
    rewards = persisted_token_rewards(ids, ANSWER, tokenizer=tokenizer, persisted_reward=P)
    assert rewards == [P] * N_TOKENS + [0.0]


@pytest.mark.parametrize("kept_text", ["", "import os\n", "a b", "ab"])
def test_kept_text_that_holds_none_of_the_answers_tokens_gives_no_token_credit(tokenizer, answer_ids, kept_text):
    assert persisted_token_rewards(answer_ids, kept_text, tokenizer=tokenizer, persisted_reward=P) is None


# ---- the exporter ----


def answer(tenant, client_id: str, completion: str = ANSWER, *, ask: str = "Add add and sub to maths.py") -> str:
    """An agent's turn, logged without token ids (the exporter tokenizes it)."""
    item = {
        "client_id": client_id,
        "messages": [{"role": "user", "content": ask}],
        "completion": completion,
        "conversation_id": f"session-{client_id}",
        "turn": 0,
        "end_user_id": "dev-1",
        "opted_in": True,
    }
    (result,) = interactions_ingest(tenant, items=[item])
    assert result.status == "created"
    return result.id


def label(tenant, client_id: str, outcome: str, **fields) -> None:
    (result,) = feedback_ingest(tenant, items=[{"client_id": client_id, "outcome": outcome, **fields}])
    assert result.status == "recorded", result.error


def export(tiny_adapter, policy) -> dict[str, dict]:
    run = TrainingRun.objects.create(tenant=tiny_adapter.tenant, adapter=tiny_adapter, status="exporting")
    window = dataset_export(run, policy=policy)
    assert not window.heldout
    return {Interaction.objects.get(pk=s.id).client_id: s for s in window.train}


def test_the_api_takes_and_stores_kept_text_with_edit_persisted(tenant, tiny_adapter, client_a):
    turn = answer(tenant, "t")
    body = {"client_id": "t", "outcome": "edit_persisted", "kept_text": ADD}
    response = client_a.post("/v1/feedback", body, format="json")
    assert response.status_code == 200, response.json()
    stored = Feedback.objects.get(interaction_id=turn)
    assert (stored.outcome, stored.kept_text) == ("edit_persisted", ADD)


def test_an_edit_that_persisted_credits_the_answers_persisted_code_token_by_token(tenant, tiny_adapter, policy):
    answer(tenant, "t")
    label(tenant, "t", "edit_persisted", kept_text=f"import math\n\n{ADD}")  # the user's file kept add only
    sample = export(tiny_adapter, policy)["t"]
    # add's tokens and the newline before it, which is in the file too
    assert list(sample.token_rewards) == persisted_only(range(ADD_TOKENS.start - 1, ADD_TOKENS.stop))
    assert sample.reward == policy.reward_edit_persisted == P  # the scalar stays the policy's


def test_the_persisted_tokens_earn_the_tenants_reward_for_edit_persisted(tenant, tiny_adapter, policy):
    policy.reward_edit_persisted = 2.0
    policy.save()
    answer(tenant, "t")
    label(tenant, "t", "edit_persisted", kept_text=ADD)
    sample = export(tiny_adapter, policy)["t"]
    assert list(sample.token_rewards) == persisted_only(reward=2.0) and sample.reward == 2.0


def test_an_edit_that_persisted_without_kept_text_keeps_its_one_reward(tenant, tiny_adapter, policy):
    turn = answer(tenant, "t")
    label(tenant, "t", "edit_persisted")
    sample = export(tiny_adapter, policy)["t"]
    unchanged = interaction_to_sample(
        Interaction.objects.get(pk=turn),
        base=tiny_adapter.base_model,
        reward=P,
        silence_reward=policy.reward_follow_up_dissatisfied,
    )
    assert sample == unchanged and sample.token_rewards is None


def test_kept_text_that_shares_nothing_with_the_answer_keeps_its_one_reward(tenant, tiny_adapter, policy):
    answer(tenant, "t")
    label(tenant, "t", "edit_persisted", kept_text="import os\n")
    sample = export(tiny_adapter, policy)["t"]
    assert sample.token_rewards is None and sample.reward == P


def test_kept_text_goes_with_edit_persisted_only(tenant, tiny_adapter, policy):
    """Another agent signal that carries a kept_text is still one reward for the whole answer."""
    answer(tenant, "t")
    label(tenant, "t", "thumbs_up", kept_text=ADD)
    assert export(tiny_adapter, policy)["t"].token_rewards is None


# ---- through the trainer ----


def test_an_edit_that_persisted_trains_toward_the_persisted_code(tenant, tiny_adapter, policy, tmp_path):
    """A user kept the add function of the answer and dropped sub: exported and trained, add's
    tokens rise against the base model, and well above sub's, which earn 0 token by token. The
    window also holds a dissatisfied follow-up to another answer, as a real window holds other
    feedback, so the batch's mean reward (the baseline) is below reward_edit_persisted.

    Margins, seeds 0-4 (the LoRA's initialisation): add's tokens rose by 0.22-0.38 nats on
    average, sub's by 0.24-0.44 less. The same window without kept_text (one reward for the whole
    answer) raised add by 0.59 and sub by 0.54 (seed 0): a gap of 0.05."""
    answer(tenant, "kept")
    label(tenant, "kept", "edit_persisted", kept_text=ADD)
    answer(tenant, "other", "I cannot edit that file.", ask="Fix the build")
    label(tenant, "other", "follow_up_dissatisfied")
    samples = export(tiny_adapter, policy)
    persisted = samples["kept"]
    assert list(persisted.token_rewards) == persisted_only() and samples["other"].token_rewards is None
    prompt, ids = list(persisted.prompt_token_ids), list(persisted.completion_token_ids)
    base_dir = tiny_adapter.base_model.path
    before = completion_logprobs(load(base_dir), prompt, ids)
    # The learning rate of tests/gpu_trainer/test_token_credit.py; two samples, so one minibatch.
    config = PPOConfig(learning_rate=5e-3, epochs=16, num_minibatches=1, target_kl=None, silence_counterfactual=False)
    result = train_ppo(
        config, list(samples.values()), base_model_dir=base_dir, out_dir=tmp_path / "out", progress=False
    )
    after = completion_logprobs(load(base_dir, result.out_dir), prompt, ids)
    rise = [a - b for a, b in zip(after, before, strict=True)]
    add_rise = sum(rise[k] for k in ADD_TOKENS) / len(ADD_TOKENS)
    sub_rise = sum(rise[k] for k in SUB_TOKENS) / len(SUB_TOKENS)
    assert add_rise > 0.1, rise
    assert add_rise > sub_rise + 0.3, rise
    assert result.summary["token_credit_samples"] == 1
