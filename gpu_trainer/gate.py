"""The eval gate: may a freshly trained candidate adapter meet users?

Four checks, every one recorded on the verdict with its numbers:

1. **finite**: the candidate is an adapter vLLM serves, with finite weights, that fits the
   base model. If not, the verdict fails at once and the other checks are skipped (a broken
   candidate is a verdict, never an exception).
2. **KL to parent**: teacher-forced on each held-out prompt + completion, the full-vocabulary
   KL(candidate ‖ parent) at every completion position, pooled over positions.
3. **off-policy reward** on the held-out logged interactions: self-normalised importance
   sampling with sequence weights w = min(π(completion) / β(completion), cap), where β is the
   serving (behaviour) probability when it was logged, else the parent's (on-policy assumption).
   The candidate passes if V_candidate ≥ V_parent − margin.
4. **FIM** (when the tenant has a set): greedy decode of each middle with candidate and parent;
   the candidate's edit similarity may be at most a margin below the parent's.

Memory holds one base model: the candidate and the parent are two named peft adapters on it,
switched with ``set_adapter``; a parent that is the base model alone is ``disable_adapter()``.
One teacher-forced forward pass per adapter and batch gives both the KL and the log-probs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpu_trainer.adapters import base_model_fingerprint, check_parent_matches_base, verify_adapter
from gpu_trainer.config import PPOConfig
from gpu_trainer.errors import AdapterInvalidError, TrainerInputError
from gpu_trainer.fim import build_fim_prompt, detect_family
from gpu_trainer.policy import (
    PaddedBatch,
    load_base_model,
    load_tokenizer,
    make_batch,
    resolve_device_dtype,
    seed_everything,
    special_token_ids,
)
from gpu_trainer.samples import Sample, check_samples_against_vocab, coerce_samples
from gpu_trainer.scoring import cut_at_stop, edit_similarity, stop_token_ids

CANDIDATE = "candidate"
PARENT = "parent"
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class GateConfig:
    """Bounds of the eval gate. Every field has a default that works on CPU."""

    max_kl: float = 0.5
    """Upper bound (nats) on the mean per-token KL(candidate ‖ parent) over held-out completion
    positions. A PPO update is meant to move the policy a little; more than this is a jump."""
    reward_margin: float = 0.05
    """The candidate's off-policy reward estimate may be at most this much below the parent's
    (reward units: the default policy gives +0.75 accepted, −0.25 rejected)."""
    importance_cap: float = 5.0
    """Sequence importance weights are clipped to [0, cap] (truncated importance sampling):
    bounds the variance one held-out completion can add to the estimate."""
    min_heldout: int = 8
    """With fewer held-out samples the reward check is recorded as skipped, not failed: too few
    to tell a better candidate from noise. KL is still measured on whatever there is."""
    fim_margin: float = 0.02
    """The candidate's mean FIM edit similarity may be at most this much below the parent's."""
    max_fim_samples: int = 64
    """Evaluate at most the first this many FIM cases (greedy decoding is the gate's slow part)."""
    max_new_tokens: int = 32
    """Longest decoded FIM middle, in tokens."""
    max_prompt_tokens: int = 1024
    """Held-out prompts are truncated from the left to this many tokens, as in training."""
    batch_size: int = 16
    """Sequences per forward pass (and per FIM decoding batch); bounds the [B, W, vocab] log-probs."""
    seed: int = 0
    """Seeds torch before evaluation; the gate has no sampling, so this pins kernels only."""
    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu`` or ``cuda[:n]``, as in PPOConfig."""
    dtype: str = "auto"
    """``auto``: bf16 on GPU, fp32 on CPU; or ``float32`` / ``bfloat16``. Log-softmax and KL are
    always computed in fp32."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``TrainerInputError`` naming the first bad field."""
        checks: list[tuple[bool, str]] = [
            (self.max_kl > 0, "max_kl must be > 0"),
            (self.reward_margin >= 0, "reward_margin must be >= 0"),
            (self.importance_cap >= 1, "importance_cap must be >= 1"),
            (self.min_heldout >= 1, "min_heldout must be >= 1"),
            (self.fim_margin >= 0, "fim_margin must be >= 0"),
            (self.max_fim_samples >= 1, "max_fim_samples must be >= 1"),
            (self.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
            (self.max_prompt_tokens >= 1, "max_prompt_tokens must be >= 1"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.dtype in ("auto", "float32", "bfloat16"), "dtype must be auto|float32|bfloat16"),
        ]
        for ok, message in checks:
            if not ok:
                raise TrainerInputError(f"gate config: {message}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateConfig:
        """Build from a dict (e.g. tenant settings); unknown keys are an error, not ignored."""
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TrainerInputError(f"gate config: unknown field(s) {', '.join(unknown)}")
        return cls(**data)


@dataclass
class GateVerdict:
    """The gate's decision and every number behind it (stored on the TrainingRun)."""

    passed: bool = False
    reasons: list[str] = field(default_factory=list)
    """One sentence per failed check; empty when the verdict passed."""
    notes: list[str] = field(default_factory=list)
    """Why a check was skipped, and other things worth knowing that are not failures."""
    finite: bool = False
    """The candidate passed ``verify_adapter`` (finite weights, a format vLLM serves) and fits the base."""
    kl_to_parent: float | None = None
    """Mean per-token KL(candidate ‖ parent) in nats; None when there was nothing to measure it on."""
    kl_check: str = SKIPPED
    kl_positions: int = 0
    """Token positions the KL was averaged over."""
    kl_source: str | None = None
    """Where the KL was measured: ``heldout`` completions, ``kl_prompts`` or the ``fim`` prompts."""
    reward_candidate: float | None = None
    """Self-normalised, clipped importance-sampling estimate of the candidate's mean reward."""
    reward_parent: float | None = None
    """The same estimate for the parent (its logged mean reward when the data is on-policy)."""
    reward_check: str = SKIPPED
    heldout_count: int = 0
    behaviour_known: int = 0
    """Held-out samples whose serving log-probs were logged (the rest assume the parent served them)."""
    effective_sample_size: float | None = None
    """(Σw)² / Σw² of the candidate's importance weights: near heldout_count means the estimate
    rests on many samples, near 1 means on a single one."""
    fim_candidate: dict[str, float] | None = None
    """{"exact_match", "edit_similarity"}, means over the FIM cases."""
    fim_parent: dict[str, float] | None = None
    fim_check: str = SKIPPED
    fim_count: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: non-finite floats become None (JSON has no NaN)."""
        return _json_safe(dataclasses.asdict(self))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def evaluate_candidate(
    *,
    base_model_dir: str | Path,
    parent_adapter_dir: str | Path | None,
    candidate_adapter_dir: str | Path,
    heldout: list[Sample] | list[dict[str, Any]],
    fim_eval: list[dict[str, Any]] | None = None,
    config: GateConfig | None = None,
    max_rank: int | None = None,
    kl_prompts: list[list[int]] | None = None,
) -> GateVerdict:
    """Run the gate on ``candidate_adapter_dir`` against its parent (None: the base model).

    ``heldout`` are logged interactions the candidate was not trained on (the trainer's sample
    format). KL is measured on their completions; without held-out samples, on the next-token
    distribution after each of ``kl_prompts`` (prompt token ids), else after each FIM prompt,
    else it is skipped. ``fim_eval`` holds ``{"prefix", "suffix", "middle"}`` cases.

    A broken candidate yields a failed verdict. Raises ``TrainerInputError`` for what the caller
    sent wrong: bad samples, FIM cases or config, a base model or parent adapter that is unusable.
    """
    started = time.perf_counter()
    config = config or GateConfig()
    config.validate()
    samples = coerce_samples(heldout)
    fim_cases = _check_fim_cases(fim_eval or [])[: config.max_fim_samples]
    verdict = GateVerdict(heldout_count=len(samples))
    if parent_adapter_dir is not None:
        verify_adapter(parent_adapter_dir, max_rank=max_rank)
    try:
        verify_adapter(candidate_adapter_dir, max_rank=max_rank)
    except AdapterInvalidError as exc:
        return _invalid(verdict, exc, started)

    seed_everything(config.seed, deterministic=True)
    device, dtype = resolve_device_dtype(PPOConfig(device=config.device, dtype=config.dtype))
    base_dir = Path(base_model_dir).resolve()
    model = load_base_model(base_dir, device, dtype)
    tokenizer = load_tokenizer(base_dir)
    eos_id, pad_id = special_token_ids(tokenizer, model)
    vocab_size = model.get_input_embeddings().num_embeddings
    if samples:
        check_samples_against_vocab(samples, vocab_size)
    fingerprint = base_model_fingerprint(base_dir)
    if parent_adapter_dir is not None:
        check_parent_matches_base(parent_adapter_dir, base_dir, fingerprint)
    try:
        model = _load_adapters(model, base_dir, fingerprint, candidate_adapter_dir, parent_adapter_dir)
    except AdapterInvalidError as exc:
        return _invalid(verdict, exc, started)
    verdict.finite = True
    parent = PARENT if parent_adapter_dir is not None else None
    family = detect_family(base_dir) if fim_cases else None
    fim_prompts = [build_fim_prompt(family, c["prefix"], c.get("suffix") or "") for c in fim_cases] if family else []

    # KL is measured on held-out completions; without any, on the first token after other prompts.
    kl_samples, verdict.kl_source = samples, "heldout"
    if not samples:
        prompts = [list(p) if isinstance(p, (list, tuple)) else p for p in kl_prompts or []]
        verdict.kl_source = "kl_prompts"
        if not prompts and fim_prompts:
            prompts = [tokenizer.encode(p, add_special_tokens=False) for p in fim_prompts]
            verdict.kl_source = "fim"
        # An empty completion is scored as [eos]: its one position is the next-token distribution.
        kl_samples = [Sample.from_dict({"prompt_token_ids": p, "completion_token_ids": [], "reward": 0.0}, i)
                      for i, p in enumerate(prompts)]
        if kl_samples:
            check_samples_against_vocab(kl_samples, vocab_size)
    stats = _teacher_forced(model, kl_samples, parent, config, eos_id=eos_id, pad_id=pad_id, device=device)

    if not kl_samples:
        verdict.kl_source = None
        verdict.notes.append("KL to parent not measured: no held-out samples, kl_prompts or FIM cases")
    else:
        kl = stats["kl_sum"] / max(stats["positions"], 1)
        verdict.kl_to_parent, verdict.kl_positions = kl, stats["positions"]
        if not math.isfinite(kl):
            verdict.kl_check = FAILED
            verdict.reasons.append(f"KL to parent is not finite ({kl}): the candidate's outputs overflow")
        elif kl > config.max_kl:
            verdict.kl_check = FAILED
            verdict.reasons.append(f"KL to parent {kl:.2f} exceeds bound {config.max_kl:.2f}")
        else:
            verdict.kl_check = PASSED

    if samples:
        _reward_check(verdict, samples, stats, config)
    else:
        verdict.notes.append("off-policy reward not estimated: no held-out samples")

    if fim_cases and family is None:
        verdict.notes.append(f"FIM check skipped: base model {base_dir.name} has no known FIM tokens")
    elif fim_cases:
        _fim_check(verdict, model, tokenizer, fim_prompts, fim_cases, parent, family, config,
                   eos_id=eos_id, pad_id=pad_id, device=device)

    verdict.passed = verdict.finite and FAILED not in (verdict.kl_check, verdict.reward_check, verdict.fim_check)
    verdict.seconds = time.perf_counter() - started
    return verdict


def _invalid(verdict: GateVerdict, exc: AdapterInvalidError, started: float) -> GateVerdict:
    verdict.finite = False
    verdict.reasons.append(f"candidate adapter is invalid: {exc}")
    verdict.notes.append("KL, reward and FIM checks skipped: the candidate cannot be loaded")
    verdict.seconds = time.perf_counter() - started
    return verdict


def _check_fim_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for index, case in enumerate(cases):
        if not isinstance(case, dict):
            raise TrainerInputError(f"FIM case {index}: expected an object, got {type(case).__name__}")
        for key in ("prefix", "middle"):
            if not isinstance(case.get(key), str):
                raise TrainerInputError(f"FIM case {index}: {key!r} must be a string")
        if not isinstance(case.get("suffix") or "", str):
            raise TrainerInputError(f"FIM case {index}: 'suffix' must be a string or null")
    return cases


def _load_adapters(model, base_dir: Path, fingerprint: str, candidate_dir: str | Path,
                   parent_dir: str | Path | None):
    """The base wrapped in peft with the candidate (and the parent, when there is one) as named,
    frozen adapters. Only a candidate that does not fit raises ``AdapterInvalidError`` here."""
    from peft import PeftModel

    # The same base-model identity test the trainer applies to a parent (its lineage record).
    check_parent_matches_base(candidate_dir, base_dir, fingerprint)
    try:
        peft_model = PeftModel.from_pretrained(model, str(candidate_dir), adapter_name=CANDIDATE)
    except (RuntimeError, ValueError, KeyError) as exc:  # shape mismatch: another base model
        raise AdapterInvalidError(f"adapter {candidate_dir} does not fit base model {base_dir}: {exc}") from None
    if parent_dir is not None:
        try:
            peft_model.load_adapter(str(parent_dir), adapter_name=PARENT)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise TrainerInputError(f"parent adapter {parent_dir} does not fit base model {base_dir}: {exc}") from None
    return peft_model.eval()


@contextmanager
def _active(model, adapter: str | None) -> Iterator[None]:
    """Run the block with ``adapter`` active; None is the base model (adapters disabled)."""
    if adapter is None:
        with model.disable_adapter():
            yield
    else:
        model.set_adapter(adapter, inference_mode=True)
        yield


def _completion_log_softmax(model, batch: PaddedBatch) -> torch.Tensor:
    """Full-vocabulary log-probs at the completion positions, [B, W, V] in fp32.

    The same forward pass as ``policy.completion_logprobs``, which gathers the chosen tokens
    only; the KL needs the whole distribution.
    """
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=batch.width + 1,
        use_cache=False,
    )
    return torch.log_softmax(out.logits[:, :-1, :].float(), dim=-1)


def _teacher_forced(model, samples: list[Sample], parent: str | None, config: GateConfig, *,
                    eos_id: int, pad_id: int, device: torch.device) -> dict[str, Any]:
    """Per-sample completion log-probs under candidate and parent ([N] float64, input order)
    and the KL summed over all completion positions."""
    count = len(samples)
    logp_candidate = torch.zeros(count, dtype=torch.float64)
    logp_parent = torch.zeros(count, dtype=torch.float64)
    kl_sum, positions = 0.0, 0
    # Similar lengths together: less padding. Results are per sample, so the order is free.
    order = sorted(range(count), key=lambda i: len(samples[i].prompt_token_ids[-config.max_prompt_tokens:])
                   + max(len(samples[i].completion_token_ids), 1))
    with torch.inference_mode():
        for start in range(0, count, config.batch_size):
            rows = order[start:start + config.batch_size]
            batch = make_batch([samples[i] for i in rows], eos_id=eos_id, pad_id=pad_id,
                               max_prompt_tokens=config.max_prompt_tokens, device=device)
            with _active(model, CANDIDATE):
                cand = _completion_log_softmax(model, batch)
            with _active(model, parent):
                par = _completion_log_softmax(model, batch)
            mask = batch.mask
            kl_tokens = (cand.exp() * (cand - par)).sum(-1)
            kl_sum += float((kl_tokens * mask).sum())
            positions += int(mask.sum())
            targets = batch.targets.unsqueeze(-1)
            index = torch.tensor(rows)
            logp_candidate[index] = (cand.gather(-1, targets).squeeze(-1) * mask).sum(-1).double().cpu()
            logp_parent[index] = (par.gather(-1, targets).squeeze(-1) * mask).sum(-1).double().cpu()
    return {"logp_candidate": logp_candidate, "logp_parent": logp_parent, "kl_sum": kl_sum, "positions": positions}


def off_policy_value(logp_policy: torch.Tensor, logp_behaviour: torch.Tensor, rewards: torch.Tensor, *,
                     cap: float) -> tuple[float, float]:
    """Self-normalised, clipped importance-sampling estimate of the policy's mean reward.

    w = clip(exp(log π − log β), 0, cap); V = Σ w·r / Σ w. Returns (V, effective sample size);
    V is NaN when every weight underflows to 0 (the policy never produces the logged completions).
    """
    weights = torch.exp(logp_policy - logp_behaviour).clamp(0.0, cap)
    total = weights.sum()
    if not total > 0:
        return math.nan, 0.0
    return float((weights * rewards).sum() / total), float(total**2 / (weights**2).sum())


def _reward_check(verdict: GateVerdict, samples: list[Sample], stats: dict[str, Any], config: GateConfig) -> None:
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    # Silence ([eos]) never has a logged log-prob: the parent is assumed to have served it.
    logged = [s.behaviour_logprobs is not None and bool(s.completion_token_ids) for s in samples]
    served = torch.tensor([math.fsum(s.behaviour_logprobs) if known and s.behaviour_logprobs else 0.0
                           for s, known in zip(samples, logged, strict=True)], dtype=torch.float64)
    behaviour = torch.where(torch.tensor(logged), served, stats["logp_parent"])
    verdict.behaviour_known = sum(logged)
    candidate, verdict.effective_sample_size = off_policy_value(
        stats["logp_candidate"], behaviour, rewards, cap=config.importance_cap)
    parent, _ = off_policy_value(stats["logp_parent"], behaviour, rewards, cap=config.importance_cap)
    verdict.reward_candidate, verdict.reward_parent = candidate, parent
    if len(samples) < config.min_heldout:
        verdict.reward_check = SKIPPED
        verdict.notes.append(f"reward check skipped: {len(samples)} held-out samples, fewer than {config.min_heldout}")
    elif not math.isfinite(candidate):
        verdict.reward_check = FAILED
        verdict.reasons.append("off-policy reward undefined: the candidate gives every held-out completion "
                               "zero probability")
    elif math.isfinite(parent) and candidate < parent - config.reward_margin:
        verdict.reward_check = FAILED
        verdict.reasons.append(f"off-policy reward {candidate:.3f} is below the parent's {parent:.3f} "
                               f"by more than the margin {config.reward_margin:.3f}")
    else:
        verdict.reward_check = PASSED


def _fim_check(verdict: GateVerdict, model, tokenizer, prompts: list[str], cases: list[dict[str, Any]],
               parent: str | None, family: str, config: GateConfig, *, eos_id: int, pad_id: int,
               device: torch.device) -> None:
    scores = {}
    for name, adapter in (("candidate", CANDIDATE), ("parent", parent)):
        with _active(model, adapter):
            middles = greedy_middles(model, tokenizer, prompts, family=family, eos_id=eos_id, pad_id=pad_id,
                                     max_new_tokens=config.max_new_tokens, batch_size=config.batch_size,
                                     device=device)
        exact = sum(m.rstrip() == c["middle"].rstrip() for m, c in zip(middles, cases, strict=True))
        similarity = sum(edit_similarity(m, c["middle"]) for m, c in zip(middles, cases, strict=True))
        scores[name] = {"exact_match": exact / len(cases), "edit_similarity": similarity / len(cases)}
    verdict.fim_candidate, verdict.fim_parent, verdict.fim_count = scores["candidate"], scores["parent"], len(cases)
    candidate, parent_score = scores["candidate"]["edit_similarity"], scores["parent"]["edit_similarity"]
    if candidate < parent_score - config.fim_margin:
        verdict.fim_check = FAILED
        verdict.reasons.append(f"FIM edit similarity {candidate:.3f} is below the parent's {parent_score:.3f} "
                               f"by more than the margin {config.fim_margin:.3f}")
    else:
        verdict.fim_check = PASSED


def greedy_middles(model, tokenizer, prompts: list[str], *, family: str, eos_id: int, pad_id: int,
                   max_new_tokens: int, batch_size: int, device: torch.device) -> list[str]:
    """Greedy FIM middles of ``prompts``, decoded in left-padded batches, each cut at its first stop.

    ``scoring.greedy_middle`` decoded one prompt at a time; batching is what keeps a 64-case
    FIM set within the gate's few seconds on CPU.
    """
    stops = stop_token_ids(tokenizer, family, eos_id)
    encoded = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    middles: list[str] = []
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start:start + batch_size]
        length = max(len(ids) for ids in chunk)
        input_ids = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk), length), dtype=torch.long)
        for row, ids in enumerate(chunk):
            input_ids[row, length - len(ids):] = torch.tensor(ids)
            attention_mask[row, length - len(ids):] = 1
        with torch.inference_mode():
            output = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stops, pad_token_id=pad_id,
            )
        for row in output[:, length:].tolist():
            end = next((i for i, t in enumerate(row) if t in stops), len(row))
            middles.append(cut_at_stop(tokenizer.decode(row[:end], skip_special_tokens=False), family))
    return middles
