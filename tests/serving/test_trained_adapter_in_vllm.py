"""An adapter the trainer wrote is served by the real vLLM server exactly as it was trained."""

from __future__ import annotations

import random
import uuid

import pytest
import torch

from apps.engines.vllm_client import VLLMClient
from gpu_trainer.config import PPOConfig
from gpu_trainer.ppo import train_ppo
from tests.gpu_trainer.helpers import load, next_token_probs, prompt_ids, typed

pytestmark = pytest.mark.vllm


def test_a_trained_adapter_loads_in_vllm_and_vllm_serves_what_it_learned(vllm_server, tmp_path):
    base = vllm_server.model_dir
    prompt = prompt_ids(base)
    base_probs = next_token_probs(load(base), prompt)
    top = [t for t in torch.topk(base_probs, 8).indices.tolist() if t != 0]
    target, others = top[3], top[:3] + top[4:]
    rng = random.Random(0)
    firsts = [target if i % 4 == 0 else others[i % len(others)] for i in range(16)]
    samples = [
        {
            "prompt_token_ids": prompt,
            "completion_token_ids": [first, rng.randrange(5, 2000)],
            "behaviour_logprobs": None,
            "reward": 1.0 if first == target else -1.0,
        }
        for first in firsts
    ]
    config = PPOConfig(learning_rate=5e-3, epochs=4, num_minibatches=2, target_kl=None)
    parent = None
    for round_index in range(3):
        out = tmp_path / f"round-{round_index}"
        train_ppo(config, typed(samples), base_model_dir=base, out_dir=out, parent_adapter_dir=parent, progress=False)
        parent = out
    trained_probs = next_token_probs(load(base, parent), prompt)
    assert trained_probs[target] > 1.5 * base_probs[target]  # it learned; test_ppo.py measures how much

    client = VLLMClient([vllm_server.base_url], timeout=60)
    name = f"trained-{uuid.uuid4().hex[:8]}"
    client.load_adapter(name, parent)
    served = client.complete(model=name, prompt=prompt, max_tokens=1, temperature=0.0)
    served_base = client.complete(model=vllm_server.served_model_name, prompt=prompt, max_tokens=1, temperature=0.0)
    first = served.choice.token_ids[0]
    assert first == int(torch.argmax(trained_probs))  # vLLM's greedy choice is the trained model's
    assert served_base.choice.token_ids[0] == int(torch.argmax(base_probs))
    assert served.choice.logprobs[0] == pytest.approx(float(torch.log(trained_probs[first])), abs=0.05)
