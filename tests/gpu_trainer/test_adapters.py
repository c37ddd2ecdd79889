"""Adapters Strop writes are what peft and vLLM load; broken or foreign ones are refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpu_trainer.adapters import verify_adapter
from gpu_trainer.config import PPOConfig
from gpu_trainer.model_loading import load_policy
from gpu_trainer.ppo import save_adapter, train_ppo
from learning_shared.errors import AdapterInvalidError, TrainingDivergedError
from tests.gpu_trainer.helpers import load, next_token_probs, prompt_ids, typed

WEIGHTS = "adapter_model.safetensors"


def _samples(prompt: list[int]) -> list[dict]:
    return [
        {
            "prompt_token_ids": prompt,
            "completion_token_ids": [100 + i, 7],
            "behaviour_logprobs": [-3.0, -2.0],
            "reward": 1.0 if i % 2 else -0.25,
        }
        for i in range(8)
    ]


@pytest.fixture(scope="module")
def adapter(tiny_starter_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapters") / "v1"
    config = PPOConfig(learning_rate=5e-3, epochs=2, num_minibatches=2, target_kl=None)
    return train_ppo(
        config,
        typed(_samples(prompt_ids(tiny_starter_model))),
        base_model_dir=tiny_starter_model,
        out_dir=out,
        progress=False,
    ).out_dir


def test_written_adapter_loads_in_peft_and_changes_the_output(tiny_starter_model, adapter):
    prompt = prompt_ids(tiny_starter_model)
    base_probs = next_token_probs(load(tiny_starter_model), prompt)
    tuned_probs = next_token_probs(load(tiny_starter_model, adapter), prompt)
    assert (base_probs - tuned_probs).abs().max() > 1e-3


def test_written_adapter_is_in_the_format_vllm_serves(adapter):
    config = verify_adapter(adapter, max_rank=16)
    assert config["peft_type"] == "LORA" and config["bias"] == "none"
    assert not config.get("modules_to_save") and not config.get("use_dora")
    keys = load_file(str(adapter / WEIGHTS)).keys()
    assert all(k.startswith("base_model.model.model.layers.") and ("lora_A" in k or "lora_B" in k) for k in keys)
    assert all(k.endswith(".weight") for k in keys)


def test_truncated_adapter_is_refused(adapter, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(adapter, broken)
    data = (broken / WEIGHTS).read_bytes()
    (broken / WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterInvalidError, match="unreadable"):
        verify_adapter(broken)


def test_nan_adapter_is_refused_as_a_parent(tiny_starter_model, adapter, tmp_path):
    poisoned = tmp_path / "nan"
    shutil.copytree(adapter, poisoned)
    tensors = load_file(str(poisoned / WEIGHTS))
    first = sorted(tensors)[0]
    tensors[first][0, 0] = float("nan")
    save_file(tensors, str(poisoned / WEIGHTS))
    with pytest.raises(AdapterInvalidError, match="non-finite"):
        verify_adapter(poisoned)
    with pytest.raises(AdapterInvalidError, match="non-finite"):
        train_ppo(
            PPOConfig(),
            typed(_samples(prompt_ids(tiny_starter_model))),
            base_model_dir=tiny_starter_model,
            out_dir=tmp_path / "child",
            parent_adapter_dir=poisoned,
            progress=False,
        )
    assert not (tmp_path / "child").exists()


def test_adapter_with_modules_to_save_is_refused(adapter, tmp_path):
    other = tmp_path / "mts"
    shutil.copytree(adapter, other)
    config = json.loads((other / "adapter_config.json").read_text())
    config["modules_to_save"] = ["lm_head"]
    (other / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterInvalidError, match="modules_to_save"):
        verify_adapter(other)


def test_parent_adapter_of_another_base_model_is_refused(tiny_starter_model, adapter, tmp_path):
    other_base = tmp_path / "other-base"
    shutil.copytree(tiny_starter_model, other_base)
    weights = load_file(str(other_base / "model.safetensors"))
    for tensor in weights.values():
        tensor.mul_(1.01)
    save_file(weights, str(other_base / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AdapterInvalidError, match="was trained on base model"):
        train_ppo(
            PPOConfig(),
            typed(_samples(prompt_ids(tiny_starter_model))),
            base_model_dir=other_base,
            out_dir=tmp_path / "child",
            parent_adapter_dir=adapter,
            progress=False,
        )
    assert not (tmp_path / "child").exists()


def test_parent_adapter_continues_and_is_recorded(tiny_starter_model, adapter, tmp_path):
    result = train_ppo(
        PPOConfig(epochs=1, num_minibatches=1),
        typed(_samples(prompt_ids(tiny_starter_model))),
        base_model_dir=tiny_starter_model,
        out_dir=tmp_path / "v2",
        parent_adapter_dir=adapter,
        progress=False,
    )
    record = json.loads((result.out_dir / "strop_train_config.json").read_text())
    assert record["parent_adapter"] == str(adapter.resolve())
    rows = [json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kl_to_base"] > 0  # the parent already differs from the base model
    assert rows[0]["logprob_mismatch"] is not None


def test_non_finite_weights_are_never_written(tiny_starter_model, tmp_path):
    config = PPOConfig()
    policy = load_policy(config, base_model_dir=tiny_starter_model, parent_adapter_dir=None)
    lora_b = next(p for n, p in policy.model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        lora_b[0, 0] = float("inf")
    with pytest.raises(TrainingDivergedError, match="non-finite"):
        save_adapter(
            policy, tmp_path / "out", config=config, mode="ppo", parent_adapter_dir=None, metrics=[], summary={}
        )
    assert list(tmp_path.iterdir()) == []
