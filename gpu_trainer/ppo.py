"""Critic-free PPO on a LoRA adapter, from served completions and their rewards.

One request gets one response and one signal, so there is no group to normalise against and
no value network: advantage = reward − baseline (per token, token reward − the same baseline, for
a sample with token-level credit: a partial accept or an edit). Read top to bottom:

    samples → advantages → one policy update (``policy_update.run_policy_update``: minibatches
      cut into passes, old log-probs, epochs × minibatches of clipped-loss steps)
      → verified adapter directory + strop_train_config.json + metrics.jsonl
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpu_trainer.adapters import ADAPTER_CONFIG, METRICS, TRAIN_CONFIG, write_adapter_dir
from gpu_trainer.batching import truncated_prompts
from gpu_trainer.config import PPOConfig
from gpu_trainer.losses import compute_advantages, token_advantages
from gpu_trainer.minibatches import summarize
from gpu_trainer.model_loading import Policy, load_policy
from gpu_trainer.policy_update import StepCallback, run_policy_update
from learning_shared.errors import TrainerInputError, TrainingDivergedError
from learning_shared.samples import Sample, check_samples_against_vocab, require_samples


@dataclass
class TrainResult:
    """What a training run produced."""

    out_dir: Path
    steps: int
    stopped_early: bool
    summary: dict[str, Any] = field(default_factory=dict)


def save_adapter(policy: Policy, out_dir: str | Path, *, config: PPOConfig, mode: str,
                 parent_adapter_dir: str | Path | None, metrics: list[dict[str, Any]],
                 summary: dict[str, Any]) -> Path:
    """Write the adapter, its config and metrics to a new directory (verified, then renamed)."""
    for name, param in policy.model.named_parameters():
        if param.requires_grad and not torch.isfinite(param).all():
            raise TrainingDivergedError(f"refusing to write an adapter with non-finite weights ({name})")

    def write(tmp: Path) -> None:
        policy.model.save_pretrained(str(tmp), safe_serialization=True)
        (tmp / "README.md").unlink(missing_ok=True)  # peft's model card template
        adapter_config = json.loads((tmp / ADAPTER_CONFIG).read_text())
        adapter_config["base_model_name_or_path"] = str(policy.base_model_dir)
        if isinstance(adapter_config.get("target_modules"), list):  # peft keeps a set: hash order
            adapter_config["target_modules"] = sorted(adapter_config["target_modules"])
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config, indent=2) + "\n")
        record = {
            "mode": mode,
            "config": config.to_dict(),
            "seed": config.seed,
            "base_model": str(policy.base_model_dir),
            "base_fingerprint": policy.base_fingerprint,
            "parent_adapter": str(Path(parent_adapter_dir).resolve()) if parent_adapter_dir else None,
            "summary": summary,
            "versions": _versions(),
        }
        (tmp / TRAIN_CONFIG).write_text(json.dumps(record, indent=2) + "\n")
        with open(tmp / METRICS, "w") as fh:
            for row in metrics:
                fh.write(json.dumps(row) + "\n")

    return write_adapter_dir(out_dir, write, max_rank=config.max_lora_rank)


def _versions() -> dict[str, str]:
    import peft
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}


def train_ppo(config: PPOConfig, samples: Sequence[Sample], *, base_model_dir: str | Path,
              out_dir: str | Path, parent_adapter_dir: str | Path | None = None, progress: bool = True,
              on_step: StepCallback | None = None) -> TrainResult:
    """Train one PPO update of a LoRA adapter on ``samples`` and write it to the new ``out_dir``.

    ``parent_adapter_dir`` continues an existing adapter (it must belong to the same base
    model); None starts a fresh LoRA. ``on_step`` receives each step's metrics (heartbeats).
    Raises ``TrainerInputError`` for bad input, ``TrainingDivergedError`` if training blew up,
    ``FileExistsError`` if ``out_dir`` exists. Nothing is left at ``out_dir`` on failure.
    """
    started = time.perf_counter()
    config.validate()
    samples = require_samples(samples)
    if Path(out_dir).exists():
        raise FileExistsError(f"output directory {out_dir} already exists; adapters are never overwritten")
    if not samples:
        raise TrainerInputError("dataset is empty: nothing to train on")

    policy = load_policy(config, base_model_dir=base_model_dir, parent_adapter_dir=parent_adapter_dir)
    check_samples_against_vocab(samples, policy.model.get_input_embeddings().num_embeddings)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    # Partial accepts and edits: each token its own advantage, against the same baseline and scale
    # (normalised, the spread is that of every advantage the update uses, the tokens' included).
    credit = [s.token_rewards for s in samples] if any(s.token_rewards is not None for s in samples) else None
    advantages = compute_advantages(rewards, baseline=config.baseline, normalize=config.normalize_advantages,
                                    token_rewards=credit)
    per_token = None
    if credit is not None:
        per_token = token_advantages(credit, rewards, baseline=config.baseline, normalize=config.normalize_advantages)

    metrics, stopped_early = run_policy_update(policy, samples, advantages, config, progress=progress, on_step=on_step,
                                               token_advantages=per_token)

    wall = time.perf_counter() - started
    summary = summarize(metrics, samples, wall, sum(m["tokens"] for m in metrics))
    summary["stopped_early"] = stopped_early
    summary["truncated_prompts"] = truncated_prompts(samples, max_prompt_tokens=config.max_prompt_tokens)
    out = save_adapter(policy, out_dir, config=config, mode="ppo", parent_adapter_dir=parent_adapter_dir,
                       metrics=metrics, summary=summary)
    return TrainResult(out_dir=out, steps=len(metrics), stopped_early=stopped_early, summary=summary)
