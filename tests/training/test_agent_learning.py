"""An agent task learned end to end: conversations logged with agent feedback, exported through the
chat template, trained with PPO; the adapter moves toward what the simulated user rewards, on
conversations it never trained on."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer

from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.dataset import dataset_export
from apps.training.models import TrainingPolicy, TrainingRun
from gpu_trainer.config import PPOConfig
from gpu_trainer.ppo import train_ppo
from learning_shared.chat import chat_prompt_ids
from tests.gpu_trainer.helpers import load, next_token_probs

pytestmark = pytest.mark.django_db

FAST = PPOConfig(learning_rate=5e-3, epochs=4, num_minibatches=2, target_kl=None, silence_counterfactual=False)
TASKS = ["parse a line", "sum a list", "open a file", "sort names", "count words", "read json", "strip spaces",
         "join paths", "split csv", "find a key", "merge dicts", "reverse text"]


def conversation(task: str) -> list[dict]:
    return [{"role": "system", "content": "You write Python."}, {"role": "user", "content": f"How do I {task}?"}]


def test_a_user_satisfied_only_by_one_answer_format_teaches_that_format(tenant, tiny_adapter, tmp_path):
    base = tiny_adapter.base_model.path
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = load(base)
    train_tasks, heldout_tasks = TASKS[:8], TASKS[8:]
    # The format the user wants: answers opening with a token the base model rarely starts with.
    probs = next_token_probs(model, chat_prompt_ids(tokenizer, base, conversation(train_tasks[0])))
    candidates = [t for t in torch.topk(probs, 12).indices.tolist() if t != tokenizer.eos_token_id]
    wanted, others = candidates[5], candidates[:5] + candidates[6:]
    rng = random.Random(0)

    items, outcomes = [], []
    for n in range(32):  # 8 conversations x 4 turns, one opening in four has the format
        first = wanted if n % 4 == 0 else others[n % len(others)]
        task = train_tasks[n % len(train_tasks)]
        items.append({
            "client_id": f"turn-{n}", "conversation_id": f"s-{n % 8}", "turn": n // 8,
            "messages": conversation(task), "completion": tokenizer.decode([first, rng.randrange(5, 2000)]),
            "completion_token_ids": [first, rng.randrange(5, 2000)], "end_user_id": f"dev-{n % 8}",
            "opted_in": True,
        })
        outcomes.append("thumbs_up" if first == wanted else "follow_up_dissatisfied")
    assert {r.status for r in interactions_ingest(tenant, items=items)} == {"created"}
    feedback_ingest(tenant, items=[{"client_id": f"turn-{n}", "outcome": o} for n, o in enumerate(outcomes)])

    policy = TrainingPolicy.objects.get(adapter=tiny_adapter)
    policy.heldout_fraction = 0.0
    policy.save()
    samples = dataset_export(TrainingRun.objects.create(tenant=tenant, adapter=tiny_adapter), policy=policy).train
    assert sorted({s.reward for s in samples}) == [-0.5, 1.0]  # the policy's agent rewards
    templated = {tuple(chat_prompt_ids(tokenizer, base, conversation(task))) for task in train_tasks}
    assert {s.prompt_token_ids for s in samples} == templated  # the conversations, as vLLM renders them
    parent = None
    for round_index in range(3):
        out = tmp_path / f"round-{round_index}"
        train_ppo(FAST, samples, base_model_dir=base, out_dir=out, parent_adapter_dir=parent, progress=False)
        parent = out

    trained = load(base, parent)
    for task in heldout_tasks:  # conversations it never trained on
        prompt = chat_prompt_ids(tokenizer, base, conversation(task))
        before = next_token_probs(model, prompt)[wanted].item()
        after = next_token_probs(trained, prompt)[wanted].item()
        assert after > 2 * before, (task, before, after)
