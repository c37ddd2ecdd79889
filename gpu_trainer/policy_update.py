"""One PPO update of the policy over a set of samples and their advantages, shared by PPO and
GRPO (``run_policy_update``). Read top to bottom:

    samples → minibatches, each cut into passes of ≤ max_tokens_per_pass tokens
      → old (and reference) log-probs, no grad, pass by pass
      → epochs × minibatches: for each pass, clipped token-level surrogate (+ KL to base),
        backward (gradients accumulate); then, with ``preference_coef``, the pairwise loss of its
        edits (``preference``), pass by pass → one AdamW step per minibatch → its metrics row

Each pass's loss is its share of the minibatch's loss (normalised by the minibatch's token or
sequence count, not the pass's), so the gradient does not depend on how a minibatch is cut.
Between passes only the per-token log-probs (old, reference) and importance weights are kept.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from gpu_trainer.batching import PaddedBatch, completion_tokens, make_batch, plan_micro_batches, sequence_length
from gpu_trainer.config import PPOConfig
from gpu_trainer.logprobs import completion_and_silence_logprobs, completion_logprobs
from gpu_trainer.losses import clipped_policy_loss, kl_to_reference, masked_mean
from gpu_trainer.memory import release_freed_memory
from gpu_trainer.minibatches import Minibatch, Pass, RunningFigures, step_metrics
from gpu_trainer.model_loading import Policy, adapter_is_identity
from gpu_trainer.precision import forward_precision
from gpu_trainer.preference import pair_logprobs, plan_pair_passes, preference_loss, preference_rows
from gpu_trainer.silence import counterfactual_advantages, silence_loss
from learning_shared.errors import TrainingDivergedError
from learning_shared.samples import Sample, silent_token_ids

StepCallback = Callable[[dict[str, Any]], None]


@dataclass
class _PassRunner:
    """How the update runs one pass: the padded batch of its rows and the policy's log-probs on it."""

    policy: Policy
    samples: list[Sample]
    config: PPOConfig
    silent_ids: torch.Tensor | None  # the silent first tokens, with silence_counterfactual

    def batch(self, rows: list[int]) -> PaddedBatch:
        # Rebuilt at every use: the padded ids of all samples are not kept between passes.
        return make_batch([self.samples[i] for i in rows], eos_id=self.policy.eos_id, pad_id=self.policy.pad_id,
                          max_prompt_tokens=self.config.max_prompt_tokens, device=self.policy.device)

    def forward(self, batch: PaddedBatch, *, with_entropy: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Completion log-probs (and entropy), and log π(silent) when silence is counterfactual."""
        model = self.policy.model
        if self.silent_ids is None:
            return (*completion_logprobs(model, batch, with_entropy=with_entropy), None)
        return completion_and_silence_logprobs(model, batch, silent_ids=self.silent_ids, with_entropy=with_entropy)


_T = TypeVar("_T")


def _known(value: _T | None, what: str) -> _T:
    """A pass's tensor that an earlier step computed (its old log-probs, weights, entropy)."""
    if value is None:
        raise RuntimeError(f"{what} missing: the first step computes them before any update")
    return value


def _pass_advantages(rows: list[int], samples: list[Sample], advantages: torch.Tensor,
                     per_token: Sequence[torch.Tensor | None] | None, eos_id: int) -> torch.Tensor:
    """The advantages of one pass: one per row ([b]) as always, or, when a row has token-level
    credit, one per token ([b, W], end-aligned as ``make_batch`` lays out the completions; the
    other rows repeat their own advantage on every token)."""
    if per_token is None or all(per_token[i] is None for i in rows):
        return advantages[rows]
    lengths = [len(completion_tokens(samples[i], eos_id)) for i in rows]
    width = max(lengths)
    out = advantages[rows].unsqueeze(-1).repeat(1, width)
    for row, (index, length) in enumerate(zip(rows, lengths, strict=True)):
        credit = per_token[index]
        if credit is not None:
            out[row, width - length:] = credit
    return out


def _minibatches(samples: list[Sample], parts: list[list[int]], advantages: torch.Tensor, rewards: torch.Tensor,
                 silence: torch.Tensor | None, *, policy: Policy, config: PPOConfig,
                 per_token: Sequence[torch.Tensor | None] | None = None,
                 pair_rows: Sequence[int] = ()) -> list[Minibatch]:
    """A fixed partition into minibatches, each cut into passes by the token budget: old and
    reference log-probs are computed in exactly the layout the gradient steps use."""
    device = policy.device
    lengths = [sequence_length(s, eos_id=policy.eos_id, max_prompt_tokens=config.max_prompt_tokens) for s in samples]
    minibatches = []
    paired = set(pair_rows)
    for part in parts:
        passes = [Pass(rows, _pass_advantages(rows, samples, advantages, per_token, policy.eos_id).to(device),
                       silence_advantages=None if silence is None else silence[rows].to(device))
                  for rows in plan_micro_batches(lengths, part, max_tokens=config.max_tokens_per_pass)]
        pairs = [i for i in part if i in paired]
        minibatches.append(Minibatch(
            passes=passes, sequences=len(part), rewards=rewards[part], advantages=advantages[part],
            tokens=sum(len(completion_tokens(samples[i], policy.eos_id)) for i in part),
            pairs=plan_pair_passes(samples, pairs, max_prompt_tokens=config.max_prompt_tokens,
                                   max_tokens=config.max_tokens_per_pass) if pairs else [],
        ))
    return minibatches


def _set_old(part: Pass, old: torch.Tensor, batch: PaddedBatch, config: PPOConfig) -> None:
    """Record the old log-probs of a pass and what follows from them: importance weights and
    the serving/training mismatch."""
    known = batch.behaviour_mask
    part.old = old
    part.weights = torch.ones_like(old)
    if config.importance_correction:
        capped = (old - batch.behaviour_logprobs).exp().clamp(max=config.importance_cap)
        part.weights = torch.where(known.bool(), capped, part.weights)
    part.mismatch_sum = float(((old - batch.behaviour_logprobs).abs() * known).sum())
    part.mismatch_tokens = int(known.sum())


def _reuses_first_step(model, config: PPOConfig) -> bool:
    """True when the policy's first training forward pass computes exactly the old log-probs:
    nothing random in train mode (no dropout), so they need no pass of their own."""
    attention_dropout: Any = getattr(model.config, "attention_dropout", 0.0)
    if config.lora_dropout > 0 or attention_dropout:
        return False
    return not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def _compute_old_logprobs(runner: _PassRunner, minibatches: list[Minibatch], *, skip: int | None,
                          reference: bool) -> None:
    """Each pass's old log-probs (the policy before this update) and, when ``reference``, its
    reference log-probs (adapter disabled). The minibatch ``skip`` is left out: it takes its old
    log-probs from its first training pass."""
    model, config = runner.policy.model, runner.config
    model.eval()
    with torch.no_grad(), forward_precision(config, runner.policy.device):
        for index, minibatch in enumerate(minibatches):
            for part in minibatch.passes:
                if index == skip:
                    continue
                batch = runner.batch(part.rows)
                old, _, part.old_silent = runner.forward(batch)
                _set_old(part, old, batch, config)
                if reference:
                    with model.disable_adapter():
                        part.reference = completion_logprobs(model, batch)[0]
                release_freed_memory()
            for pair in minibatch.pairs:  # every minibatch's: the first step's too
                pair.old_kept, pair.old_shown = pair_logprobs(runner.policy, runner.samples, pair.rows, config)


def _accumulate_gradients(runner: _PassRunner, minibatch: Minibatch, *, need_reference: bool,
                          where: str) -> RunningFigures | None:
    """Forward and backward every pass of ``minibatch`` (its gradients accumulate) and add up its
    figures; None when its approx KL went past ``target_kl``, before that pass's backward."""
    config = runner.config
    shares = dict(tokens=minibatch.tokens, sequences=minibatch.sequences)
    # One counterfactual per event: it weighs as one token (token_mean) or one sequence.
    silence_denominator = shares["sequences" if config.loss_aggregation == "sequence_mean" else "tokens"]
    nan = torch.tensor(float("nan"))
    figures = RunningFigures()
    for part in minibatch.passes:
        batch = runner.batch(part.rows)
        with forward_precision(config, runner.policy.device):
            new, entropy, new_silent = runner.forward(batch, with_entropy=True)
        if part.old is None:  # the first step's minibatch: the policy is still the old one
            _set_old(part, new.detach(), batch, config)
            part.old_silent = None if new_silent is None else new_silent.detach()
        if need_reference and part.reference is None:
            part.reference = part.old
        policy_loss, approx_kl, clip_fraction = clipped_policy_loss(
            new, _known(part.old, "old log-probs"), part.advantages, batch.mask, _known(part.weights, "weights"),
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
            silent_loss = silence_loss(new_silent, _known(part.old_silent, "old silence log-probs"),
                                       _known(part.silence_advantages, "silence advantages"),
                                       clip=config.silence_clip, denominator=silence_denominator)
            loss = loss + silent_loss
        if not torch.isfinite(loss):
            raise TrainingDivergedError(f"non-finite loss at {where}")
        # Every token's KL term is >= 0, so the passes so far bound the minibatch's approx KL
        # from below: once past target_kl, the minibatch will not be stepped, whatever its other
        # passes hold. Stop before this backward (the same decision, and the same adapter, as
        # reading every pass first).
        if config.target_kl is not None and figures.approx_kl + float(approx_kl) > config.target_kl:
            return None
        loss.backward()
        figures.add(
            policy_loss=policy_loss.detach(),
            loss=loss.detach(),
            approx_kl=approx_kl,
            clip_fraction=clip_fraction,
            entropy=masked_mean(_known(entropy, "entropy"), batch.mask, tokens=minibatch.tokens),
            kl_to_base=kl_base.detach(),
            silence_loss=silent_loss.detach(),
            silence_prob_sum=nan if new_silent is None else new_silent.detach().exp().sum(),
        )
        figures.importance_weight_sum += float((_known(part.weights, "weights") * batch.mask).sum())
        figures.tokens += batch.num_tokens
        del new, entropy, loss, policy_loss, kl_base, new_silent, silent_loss  # this pass's graph
        release_freed_memory()
    for pair in minibatch.pairs:
        kept, shown = pair_logprobs(runner.policy, runner.samples, pair.rows, config)
        pair_loss, margins = preference_loss(kept, shown, _known(pair.old_kept, "old log-probs"),
                                             _known(pair.old_shown, "old log-probs"), beta=config.preference_beta,
                                             coef=config.preference_coef, denominator=minibatch.sequences)
        if not torch.isfinite(pair_loss):
            raise TrainingDivergedError(f"non-finite preference loss at {where}")
        pair_loss.backward()
        figures.add(preference_loss=pair_loss.detach(), preference_margin_sum=margins.sum(),
                    loss=pair_loss.detach())
        del kept, shown, pair_loss
        release_freed_memory()
    return figures


def run_policy_update(policy: Policy, samples: list[Sample], advantages: torch.Tensor, config: PPOConfig, *,
                      progress: bool, on_step: StepCallback | None = None, step_offset: int = 0,
                      token_advantages: Sequence[torch.Tensor | None] | None = None
                      ) -> tuple[list[dict[str, Any]], bool]:
    """One PPO update over ``samples`` (PPO and GRPO share it). Returns (step metrics, stopped early).

    ``token_advantages`` (PPO, from ``losses.token_advantages``): per sample, one advantage per
    completion token where it has token-level credit, else None (the sample's ``advantages``
    entry on every token)."""
    from tqdm import tqdm

    model, device = policy.model, policy.device
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    generator = torch.Generator().manual_seed(config.seed)
    num_minibatches = min(config.num_minibatches, len(samples))
    order = torch.randperm(len(samples), generator=generator)
    epoch_orders = [torch.randperm(num_minibatches, generator=generator).tolist() for _ in range(config.epochs)]

    silence = counterfactual_advantages(samples, rewards, config)  # None without silence_counterfactual
    silent_ids = torch.tensor(silent_token_ids(samples, policy.eos_id), device=device) if silence is not None else None
    runner = _PassRunner(policy, samples, config, silent_ids)
    # An edit's kept text against the completion shown, when the pairwise loss is on.
    pair_rows = preference_rows(samples) if config.preference_coef > 0 else []
    minibatches = _minibatches(samples, [p.tolist() for p in order.tensor_split(num_minibatches)], advantages,
                               rewards, silence, policy=policy, config=config, per_token=token_advantages,
                               pair_rows=pair_rows)

    # Old log-probs (the policy before this update) and the reference (adapter disabled).
    # A fresh LoRA has lora_B = 0, so the reference equals the old policy: no second pass. The
    # minibatch stepped first needs no old pass either when its first forward pass computes the
    # same numbers (no dropout): it takes them from there.
    need_reference = config.kl_coef > 0 or config.measure_kl_to_base
    reference_is_old = adapter_is_identity(model)
    first = epoch_orders[0][0] if _reuses_first_step(model, config) and not (
        need_reference and not reference_is_old) else None
    _compute_old_logprobs(runner, minibatches, skip=first, reference=need_reference and not reference_is_old)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=config.adam_betas,
                                  weight_decay=config.weight_decay)
    total_steps = config.epochs * num_minibatches
    bar = tqdm(total=total_steps, desc="ppo", unit="step", disable=not (progress and sys.stderr.isatty()))
    metrics: list[dict[str, Any]] = []
    stopped_early = False
    model.train()
    try:
        for epoch in range(config.epochs):
            for mb in epoch_orders[epoch]:
                started = time.perf_counter()
                minibatch = minibatches[mb]
                optimizer.zero_grad(set_to_none=True)
                figures = _accumulate_gradients(runner, minibatch, need_reference=need_reference,
                                                where=f"epoch {epoch} minibatch {mb}")
                if figures is None:  # this minibatch already moved too far: do not step
                    stopped_early = True
                    break
                grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                if not torch.isfinite(grad_norm):
                    raise TrainingDivergedError(f"non-finite gradient norm at epoch {epoch} minibatch {mb}")
                optimizer.step()
                elapsed = time.perf_counter() - started
                row = {
                    "step": step_offset + len(metrics),
                    "epoch": epoch,
                    "minibatch": mb,
                    **step_metrics(figures, minibatch, grad_norm=float(grad_norm), elapsed=elapsed, config=config,
                                    kl_measured=need_reference, silence=silence is not None),
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
