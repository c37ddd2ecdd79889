"""Offline GRPO, for comparison with PPO (as the seed did): sample a group per prompt from the
policy itself, score each completion, normalise rewards within the group, and apply the same
clipped loss through the same update loop as PPO (``policy_update.run_policy_update``).

Records are FIM cases ``{"prefix", "suffix", "middle"}``; the default score is the edit
similarity of the sampled middle to the reference ``middle``. Online serving cannot do this:
one request gets one response, hence PPO with a batch baseline there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpu_trainer.config import GRPOConfig
from gpu_trainer.decoding import cut_at_stop, stop_token_ids
from gpu_trainer.minibatches import summarize
from gpu_trainer.model_loading import Policy, load_policy
from gpu_trainer.policy_update import StepCallback, run_policy_update
from gpu_trainer.ppo import TrainResult, save_adapter
from learning_shared.errors import TrainerInputError
from learning_shared.fim import build_fim_prompt, detect_family
from learning_shared.fim_metrics import edit_similarity
from learning_shared.samples import Sample

ScoreFn = Callable[[str, dict[str, Any]], float]


def score_by_edit_similarity(completion: str, record: dict[str, Any]) -> float:
    """Default GRPO reward: edit similarity of the sampled middle to the reference middle."""
    return edit_similarity(completion, record["middle"])


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(r − group mean) / group std; a group whose members all scored the same teaches nothing."""
    std = rewards.std()
    if not torch.isfinite(std) or std < 1e-6:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / std


def sample_group(policy: Policy, prompt_ids: list[int], config: GRPOConfig, family: str) -> list[list[int]]:
    """``group_size`` completions of one prompt, each cut after its first stop token."""
    stops = stop_token_ids(policy.tokenizer, family, policy.eos_id)
    input_ids = torch.tensor([prompt_ids] * config.group_size, device=policy.device)
    policy.model.eval()
    with torch.no_grad():
        output = policy.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            temperature=config.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=config.max_new_tokens,
            eos_token_id=stops,
            pad_token_id=policy.pad_id,
        )
    completions = []
    for row in output[:, len(prompt_ids):].tolist():
        cut = next((i for i, t in enumerate(row) if t in stops), None)
        completions.append(row[: cut + 1] if cut is not None else row)
    return completions


def train_grpo(config: GRPOConfig, records: list[dict[str, Any]], *, base_model_dir: str | Path, out_dir: str | Path,
               parent_adapter_dir: str | Path | None = None, score_fn: ScoreFn = score_by_edit_similarity,
               progress: bool = True, on_step: StepCallback | None = None) -> TrainResult:
    """``config.rounds`` × (sample groups → score → one update) and write the adapter to ``out_dir``."""
    started = time.perf_counter()
    config.validate()
    if Path(out_dir).exists():
        raise FileExistsError(f"output directory {out_dir} already exists; adapters are never overwritten")
    if not records:
        raise TrainerInputError("dataset is empty: nothing to train on")
    for index, record in enumerate(records):
        missing = [k for k in ("prefix", "middle") if not isinstance(record.get(k), str)]
        if missing:
            raise TrainerInputError(f"sample {index}: GRPO needs string field(s) {', '.join(missing)}")
    family = detect_family(base_model_dir)  # a plain model samples from the prefix alone

    policy = load_policy(config, base_model_dir=base_model_dir, parent_adapter_dir=parent_adapter_dir)
    metrics: list[dict[str, Any]] = []
    stopped_early = False
    all_samples: list[Sample] = []
    for _ in range(config.rounds):
        samples: list[Sample] = []
        advantages: list[torch.Tensor] = []
        for record in records:
            prompt = build_fim_prompt(family, record["prefix"], record.get("suffix", ""))
            prompt_ids = policy.tokenizer.encode(prompt, add_special_tokens=False)
            group = sample_group(policy, prompt_ids, config, family)
            texts = [cut_at_stop(policy.tokenizer.decode(c, skip_special_tokens=False), family) for c in group]
            rewards = torch.tensor([float(score_fn(text, record)) for text in texts])
            advantages.append(group_advantages(rewards))
            samples.extend(
                Sample(tuple(prompt_ids), tuple(c), None, float(r))
                for c, r in zip(group, rewards.tolist(), strict=True)
            )
        round_metrics, stopped_early = run_policy_update(
            policy, samples, torch.cat(advantages), config, progress=progress, on_step=on_step,
            step_offset=len(metrics),
        )
        metrics.extend(round_metrics)
        all_samples.extend(samples)

    wall = time.perf_counter() - started
    summary = summarize(metrics, all_samples, wall, sum(m["tokens"] for m in metrics))
    summary["stopped_early"] = stopped_early
    out = save_adapter(policy, out_dir, config=config, mode="grpo", parent_adapter_dir=parent_adapter_dir,
                       metrics=metrics, summary=summary)
    return TrainResult(out_dir=out, steps=len(metrics), stopped_early=stopped_early, summary=summary)
