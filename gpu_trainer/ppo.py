"""Critic-free PPO on a LoRA adapter, from served completions and their rewards.

One request gets one response and one signal, so there is no group to normalise against and
no value network: advantage = reward − baseline. Read top to bottom:

    samples → advantages → minibatches, each cut into passes of ≤ max_tokens_per_pass tokens
      → old (and reference) log-probs, no grad, pass by pass
      → epochs × minibatches: for each pass, clipped token-level surrogate (+ KL to base),
        backward (gradients accumulate) → one AdamW step per minibatch
      → verified adapter directory + strop_train_config.json + metrics.jsonl

Each pass's loss is its share of the minibatch's loss (normalised by the minibatch's token or
sequence count, not the pass's), so the gradient does not depend on how a minibatch is cut.
Between passes only the per-token log-probs (old, reference) and importance weights are kept.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpu_trainer.adapters import ADAPTER_CONFIG, METRICS, TRAIN_CONFIG, base_model_fingerprint, write_adapter_dir
from gpu_trainer.config import PPOConfig
from gpu_trainer.errors import TrainerInputError, TrainingDivergedError
from gpu_trainer.losses import clipped_policy_loss, compute_advantages, kl_to_reference, masked_mean
from gpu_trainer.policy import (
    PaddedBatch,
    adapter_is_identity,
    attach_lora,
    completion_and_silence_logprobs,
    completion_logprobs,
    completion_tokens,
    enable_gradient_checkpointing,
    forward_precision,
    load_base_model,
    load_tokenizer,
    make_batch,
    plan_micro_batches,
    release_freed_memory,
    resolve_device_dtype,
    seed_everything,
    sequence_length,
    special_token_ids,
)
from gpu_trainer.samples import Sample, check_samples_against_vocab, coerce_samples, silent_token_ids
from gpu_trainer.silence import counterfactual_advantages, silence_loss

StepCallback = Callable[[dict[str, Any]], None]


@dataclass
class TrainResult:
    """What a training run produced."""

    out_dir: Path
    steps: int
    stopped_early: bool
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class Policy:
    """The LoRA-wrapped model and what the loops need to know about its base."""

    model: Any  # peft.PeftModel
    tokenizer: Any
    eos_id: int
    pad_id: int
    device: torch.device
    base_model_dir: Path
    base_fingerprint: str


def load_policy(config: PPOConfig, *, base_model_dir: str | Path, parent_adapter_dir: str | Path | None) -> Policy:
    """Base model + tokenizer + trainable LoRA (fresh or the parent's), seeded first."""
    seed_everything(config.seed, deterministic=config.deterministic)
    device, dtype = resolve_device_dtype(config)
    base_dir = Path(base_model_dir).resolve()
    model = load_base_model(base_dir, device, dtype)
    tokenizer = load_tokenizer(base_dir)
    eos_id, pad_id = special_token_ids(tokenizer, model)
    fingerprint = base_model_fingerprint(base_dir)
    peft_model = attach_lora(model, config, base_model_dir=base_dir, base_fingerprint=fingerprint,
                             parent_adapter_dir=parent_adapter_dir)
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(peft_model)
    return Policy(peft_model, tokenizer, eos_id, pad_id, device, base_dir, fingerprint)


def _std(values: torch.Tensor) -> float:
    return float(values.std()) if values.numel() > 1 else 0.0


@dataclass
class Pass:
    """One forward pass of a minibatch: its samples and what is kept of them between passes."""

    rows: list[int]  # sample indices, shortest first
    advantages: torch.Tensor  # [b]
    old: torch.Tensor | None = None  # [b, W] log-probs before the update (None until computed)
    reference: torch.Tensor | None = None  # [b, W] log-probs of the base model, when measured
    weights: torch.Tensor | None = None  # [b, W] importance weights
    mismatch: tuple[float, int] = (0.0, 0)  # Σ|old − behaviour| over known tokens, their count
    silence_advantages: torch.Tensor | None = None  # [b] with silence_counterfactual
    old_silent: torch.Tensor | None = None  # [b] log π_old(a silent first token), with silence_counterfactual


@dataclass
class Minibatch:
    passes: list[Pass]
    tokens: int  # completion tokens (the token_mean denominator)
    sequences: int  # samples (the sequence_mean denominator)
    rewards: torch.Tensor
    advantages: torch.Tensor


def _set_old(part: Pass, old: torch.Tensor, batch: PaddedBatch, config: PPOConfig) -> None:
    """Record the old log-probs of a pass and what follows from them: importance weights and
    the serving/training mismatch."""
    known = batch.behaviour_mask
    part.old = old
    part.weights = torch.ones_like(old)
    if config.importance_correction:
        capped = (old - batch.behaviour_logprobs).exp().clamp(max=config.importance_cap)
        part.weights = torch.where(known.bool(), capped, part.weights)
    part.mismatch = (float(((old - batch.behaviour_logprobs).abs() * known).sum()), int(known.sum()))


def _reuses_first_step(model, config: PPOConfig) -> bool:
    """True when the policy's first training forward pass computes exactly the old log-probs:
    nothing random in train mode (no dropout), so they need no pass of their own."""
    if config.lora_dropout > 0 or getattr(model.config, "attention_dropout", 0.0):
        return False
    return not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def run_policy_update(policy: Policy, samples: list[Sample], advantages: torch.Tensor, config: PPOConfig, *,
                      progress: bool, on_step: StepCallback | None = None, step_offset: int = 0
                      ) -> tuple[list[dict[str, Any]], bool]:
    """One PPO update over ``samples`` (PPO and GRPO share it). Returns (step metrics, stopped early)."""
    from tqdm import tqdm

    model, device = policy.model, policy.device
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    generator = torch.Generator().manual_seed(config.seed)
    num_minibatches = min(config.num_minibatches, len(samples))
    order = torch.randperm(len(samples), generator=generator)
    epoch_orders = [torch.randperm(num_minibatches, generator=generator).tolist() for _ in range(config.epochs)]

    def batch_of(rows: list[int]) -> PaddedBatch:
        # Rebuilt at every use: the padded ids of all samples are not kept between passes.
        return make_batch([samples[i] for i in rows], eos_id=policy.eos_id, pad_id=policy.pad_id,
                          max_prompt_tokens=config.max_prompt_tokens, device=device)

    # A fixed partition into minibatches, each cut into passes by the token budget: old and
    # reference log-probs are computed in exactly the layout the gradient steps use.
    lengths = [sequence_length(s, eos_id=policy.eos_id, max_prompt_tokens=config.max_prompt_tokens) for s in samples]
    silence = counterfactual_advantages(samples, rewards, config)  # None without silence_counterfactual
    silent_ids = torch.tensor(silent_token_ids(samples, policy.eos_id), device=device) if silence is not None else None
    # One counterfactual per event: it weighs as one token (token_mean) or one sequence.
    silence_denominator = "sequences" if config.loss_aggregation == "sequence_mean" else "tokens"
    minibatches = []
    for part in (p.tolist() for p in order.tensor_split(num_minibatches)):
        passes = [Pass(rows, advantages[rows].to(device),
                       silence_advantages=None if silence is None else silence[rows].to(device))
                  for rows in plan_micro_batches(lengths, part, max_tokens=config.max_tokens_per_pass)]
        minibatches.append(Minibatch(
            passes=passes, sequences=len(part), rewards=rewards[part], advantages=advantages[part],
            tokens=sum(len(completion_tokens(samples[i], policy.eos_id)) for i in part),
        ))

    # Old log-probs (the policy before this update) and the reference (adapter disabled).
    # A fresh LoRA has lora_B = 0, so the reference equals the old policy: no second pass. The
    # minibatch stepped first needs no old pass either when its first forward pass computes the
    # same numbers (no dropout): it takes them from there.
    need_reference = config.kl_coef > 0 or config.measure_kl_to_base
    reference_is_old = adapter_is_identity(model)
    first = epoch_orders[0][0] if _reuses_first_step(model, config) and not (
        need_reference and not reference_is_old) else None
    def forward(batch: PaddedBatch, *, with_entropy: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Completion log-probs (and entropy), and log π(silent) when silence is counterfactual."""
        if silence is None:
            return (*completion_logprobs(model, batch, with_entropy=with_entropy), None)
        return completion_and_silence_logprobs(model, batch, silent_ids=silent_ids, with_entropy=with_entropy)

    model.eval()
    with torch.no_grad(), forward_precision(config, device):
        for index, minibatch in enumerate(minibatches):
            for part in minibatch.passes:
                if index == first:
                    continue
                batch = batch_of(part.rows)
                old, _, part.old_silent = forward(batch)
                _set_old(part, old, batch, config)
                if need_reference and not reference_is_old:
                    with model.disable_adapter():
                        part.reference = completion_logprobs(model, batch)[0]
                release_freed_memory()

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=config.adam_betas,
                                  weight_decay=config.weight_decay)
    total_steps = config.epochs * num_minibatches
    bar = tqdm(total=total_steps, desc="ppo", unit="step", disable=not (progress and sys.stderr.isatty()))
    metrics: list[dict[str, Any]] = []
    stopped_early = False
    nan = torch.tensor(float("nan"))
    model.train()
    try:
        for epoch in range(config.epochs):
            for mb in epoch_orders[epoch]:
                started = time.perf_counter()
                minibatch = minibatches[mb]
                shares = dict(tokens=minibatch.tokens, sequences=minibatch.sequences)
                optimizer.zero_grad(set_to_none=True)
                # policy loss, loss, approx KL, clip, entropy, KL base, silence loss, Σ π(silent)
                totals = torch.zeros(8, dtype=torch.float64)
                weight_sum, tokens = 0.0, 0
                for part in minibatch.passes:
                    batch = batch_of(part.rows)
                    with forward_precision(config, device):
                        new, entropy, new_silent = forward(batch, with_entropy=True)
                    if part.old is None:  # the first step's minibatch: the policy is still the old one
                        _set_old(part, new.detach(), batch, config)
                        part.old_silent = None if new_silent is None else new_silent.detach()
                    if need_reference and part.reference is None:
                        part.reference = part.old
                    policy_loss, approx_kl, clip_fraction = clipped_policy_loss(
                        new, part.old, part.advantages, batch.mask, part.weights,
                        clip_eps=config.clip_eps, aggregation=config.loss_aggregation, **shares,
                    )
                    loss = policy_loss
                    kl_base = nan
                    if part.reference is not None:
                        kl_base = masked_mean(kl_to_reference(new, part.reference), batch.mask,
                                              config.loss_aggregation, **shares)
                        if config.kl_coef > 0:
                            loss = loss + config.kl_coef * kl_base
                    silent_loss = torch.zeros(())
                    if new_silent is not None:
                        silent_loss = silence_loss(new_silent, part.old_silent, part.silence_advantages,
                                                   clip=config.silence_clip, denominator=shares[silence_denominator])
                        loss = loss + silent_loss
                    if not torch.isfinite(loss):
                        raise TrainingDivergedError(f"non-finite loss at epoch {epoch} minibatch {mb}")
                    # Every token's KL term is >= 0, so the passes so far bound the minibatch's
                    # approx KL from below: once past target_kl, the minibatch will not be
                    # stepped, whatever its other passes hold. Stop before this backward (the
                    # same decision, and the same adapter, as reading every pass first).
                    if config.target_kl is not None and float(totals[2]) + float(approx_kl) > config.target_kl:
                        stopped_early = True
                        break
                    loss.backward()
                    totals += torch.stack([
                        policy_loss.detach(), loss.detach(), approx_kl, clip_fraction,
                        masked_mean(entropy, batch.mask, tokens=minibatch.tokens), kl_base.detach(),
                        silent_loss.detach(), nan if new_silent is None else new_silent.detach().exp().sum(),
                    ]).double().cpu()
                    weight_sum += float((part.weights * batch.mask).sum())
                    tokens += batch.num_tokens
                    del new, entropy, loss, policy_loss, kl_base, new_silent, silent_loss  # this pass's graph
                    release_freed_memory()
                if stopped_early:  # this minibatch already moved too far: do not step
                    break
                stats = totals.tolist()
                grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                if not torch.isfinite(grad_norm):
                    raise TrainingDivergedError(f"non-finite gradient norm at epoch {epoch} minibatch {mb}")
                optimizer.step()
                elapsed = time.perf_counter() - started
                mismatch = [sum(p.mismatch[i] for p in minibatch.passes) for i in (0, 1)]
                row = {
                    "step": step_offset + len(metrics),
                    "epoch": epoch,
                    "minibatch": mb,
                    "policy_loss": stats[0],
                    "loss": stats[1],
                    "approx_kl": stats[2],
                    "clip_fraction": stats[3],
                    "entropy": stats[4],
                    "grad_norm": float(grad_norm),
                    "kl_to_base": stats[5] if need_reference else None,
                    "silence_loss": stats[6] if silence is not None else None,
                    "silence_prob": stats[7] / minibatch.sequences if silence is not None else None,
                    "reward_mean": float(minibatch.rewards.mean()),
                    "reward_std": _std(minibatch.rewards),
                    "advantage_mean": float(minibatch.advantages.mean()),
                    "advantage_std": _std(minibatch.advantages),
                    "logprob_mismatch": mismatch[0] / mismatch[1] if mismatch[1] else None,
                    "importance_weight_mean": weight_sum / max(minibatch.tokens, 1),
                    "samples": minibatch.sequences,
                    "completion_tokens": minibatch.tokens,
                    "tokens": tokens,
                    "passes": len(minibatch.passes),
                    "tokens_per_s": tokens / elapsed,
                    "learning_rate": config.learning_rate,
                }
                metrics.append(row)
                if on_step is not None:
                    on_step(row)
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss']:.4f}", kl=f"{row['approx_kl']:.4f}")
            if stopped_early:
                break
    finally:
        bar.close()
        model.eval()
    return metrics, stopped_early


def summarize(metrics: list[dict[str, Any]], samples: list[Sample], wall_seconds: float, tokens: int) -> dict[str, Any]:
    rewards = torch.tensor([s.reward for s in samples])
    last = metrics[-1] if metrics else {}
    return {
        "samples": len(samples),
        "steps": len(metrics),
        "reward_mean": float(rewards.mean()),
        "reward_std": _std(rewards),
        "final_policy_loss": last.get("policy_loss"),
        "final_approx_kl": last.get("approx_kl"),
        "final_kl_to_base": last.get("kl_to_base"),
        "mean_clip_fraction": sum(m["clip_fraction"] for m in metrics) / len(metrics) if metrics else None,
        "wall_seconds": round(wall_seconds, 3),
        "tokens_per_s": tokens / wall_seconds if wall_seconds > 0 else None,
    }


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


def train_ppo(config: PPOConfig, samples: list[Sample] | list[dict[str, Any]], *, base_model_dir: str | Path,
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
    samples = coerce_samples(samples)
    if Path(out_dir).exists():
        raise FileExistsError(f"output directory {out_dir} already exists; adapters are never overwritten")
    if not samples:
        raise TrainerInputError("dataset is empty: nothing to train on")

    policy = load_policy(config, base_model_dir=base_model_dir, parent_adapter_dir=parent_adapter_dir)
    check_samples_against_vocab(samples, policy.model.get_input_embeddings().num_embeddings)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    advantages = compute_advantages(rewards, baseline=config.baseline, normalize=config.normalize_advantages)

    metrics, stopped_early = run_policy_update(policy, samples, advantages, config, progress=progress, on_step=on_step)

    wall = time.perf_counter() - started
    summary = summarize(metrics, samples, wall, sum(m["tokens"] for m in metrics))
    summary["stopped_early"] = stopped_early
    out = save_adapter(policy, out_dir, config=config, mode="ppo", parent_adapter_dir=parent_adapter_dir,
                       metrics=metrics, summary=summary)
    return TrainResult(out_dir=out, steps=len(metrics), stopped_early=stopped_early, summary=summary)
