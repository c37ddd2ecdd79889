"""The eval gate: may a freshly trained candidate adapter meet users?

Five checks, every one recorded on the verdict with its numbers:

1. **finite**: the candidate is an adapter vLLM serves, with finite weights, that fits the
   base model. If not, the verdict fails at once and the other checks are skipped (a broken
   candidate is a verdict, never an exception).
2. **KL to parent**: teacher-forced on each held-out prompt + completion, the full-vocabulary
   KL(candidate ‖ parent) at every completion position, pooled over positions.
3. **off-policy reward** on the held-out logged interactions: self-normalised importance
   sampling with sequence weights w = min(π(completion) / β(completion), cap), where β is the
   serving (behaviour) probability when it was logged, else the parent's (on-policy assumption).
   The candidate passes if V_candidate ≥ V_parent − margin. Each is valued as it will be served:
   a logged suggestion that a version's show filter withholds (its log-probability under that
   version below the gate's threshold) earns that version silence's reward instead.
4. **FIM** (when the tenant has a set): greedy decode of each middle with candidate and parent
   (prefix alone for a ``plain`` model); the candidate fails when its edit similarity minus the
   parent's, paired by case, has a 95 % interval wholly below −tolerance (``fim_decision``;
   under 5 cases, the means against a fixed margin). The same decodes, and one of the base model
   where the parent is an adapter, make the tenant's offline evaluation (``fim_figures``:
   first-line and whole-middle matches and edit similarity with 95 % intervals, and the paired
   lift over the parent).
5. **feedback direction** (when the caller gives the window's shown suggestions): the window's
   accepts must not run against the model's confidence (``feedback_direction_z``). Outcomes
   reported the wrong way round pass checks 2 to 4, which read the same reports (an inverted
   round passed them all on a GPU, eval set included, and took back two rounds' learning); they
   turn over the relation every clean window shows between a suggestion's log-probability and
   its acceptance.

Memory holds one base model: the candidate and the parent are two named peft adapters on it,
switched with ``set_adapter``; a parent that is the base model alone is ``disable_adapter()``.
One teacher-forced forward pass per adapter and pass gives both the KL and the log-probs
(``teacher_forced.py``); FIM decoding is ``decoding.py``'s, shared with ``score``; every pass
holds at most ``GateConfig.max_tokens_per_pass`` tokens. Config and verdict: ``gate_config.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gpu_trainer.adapters import check_parent_matches_base, verify_adapter
from gpu_trainer.batching import truncated_prompts
from gpu_trainer.config import PPOConfig
from gpu_trainer.decoding import fim_case_scores, greedy_completions
from gpu_trainer.gate_config import FAILED, PASSED, SKIPPED, GateConfig, GateVerdict
from gpu_trainer.model_loading import load_base_model, load_tokenizer, seed_everything, special_token_ids
from gpu_trainer.precision import resolve_device_dtype
from gpu_trainer.teacher_forced import active_adapter, off_policy_value, teacher_forced
from learning_shared.errors import AdapterInvalidError, TrainerInputError
from learning_shared.fim import build_fim_prompt, detect_family
from learning_shared.fim_metrics import means
from learning_shared.fingerprint import base_model_fingerprint
from learning_shared.intervals import MIN_MEAN_INTERVAL_N
from learning_shared.offline_eval import fim_figures
from learning_shared.samples import Sample, check_samples_against_vocab, require_samples
from learning_shared.show_filter import MIN_ACCEPTED, ShowEvent, feedback_direction

# What callers import from here: the gate's API in one place.
__all__ = ["GateConfig", "GateVerdict", "evaluate_candidate", "feedback_check", "fim_decision", "off_policy_value",
           "PASSED", "FAILED", "SKIPPED"]

CANDIDATE = "candidate"
PARENT = "parent"
PAIRED, MARGIN = "paired", "margin"  # the FIM check's rules (GateVerdict.fim_rule)


def evaluate_candidate(
    *,
    base_model_dir: str | Path,
    parent_adapter_dir: str | Path | None,
    candidate_adapter_dir: str | Path,
    heldout: Sequence[Sample],
    fim_eval: list[dict[str, Any]] | None = None,
    config: GateConfig | None = None,
    max_rank: int | None = None,
    kl_prompts: list[list[int]] | None = None,
    candidate_show_threshold: float | None = None,
    parent_show_threshold: float | None = None,
    silence_reward: float = 0.0,
    window_show_events: Sequence[ShowEvent] | None = None,
) -> GateVerdict:
    """Run the gate on ``candidate_adapter_dir`` against its parent (None: the base model).

    ``heldout`` are logged interactions the candidate was not trained on (the trainer's sample
    format, typed). KL is measured on their completions; without held-out samples, on the next-token
    distribution after each of ``kl_prompts`` (prompt token ids), else after each FIM prompt,
    else it is skipped. ``fim_eval`` holds ``{"prefix", "suffix", "middle"}`` cases.
    ``window_show_events``: the shown suggestions of the window the candidate was trained on, as the
    show filter is fitted on them, for the feedback check (None: skipped).

    A broken candidate yields a failed verdict. Raises ``TrainerInputError`` for what the caller
    sent wrong: bad samples, FIM cases or config, a base model or parent adapter that is unusable.
    """
    started = time.perf_counter()
    config = config or GateConfig()
    config.validate()
    samples = require_samples(heldout)
    fim_cases = _check_fim_cases(fim_eval or [])[: config.max_fim_samples]
    verdict = GateVerdict(heldout_count=len(samples),
                          truncated_prompts=truncated_prompts(samples, max_prompt_tokens=config.max_prompt_tokens))
    feedback_check(verdict, window_show_events, config)
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
    family = detect_family(base_dir)
    fim_prompts = [build_fim_prompt(family, c["prefix"], c.get("suffix") or "") for c in fim_cases]

    # KL is measured on held-out completions; without any, on the first token after other prompts.
    kl_samples, verdict.kl_source = samples, "heldout"
    if not samples:
        prompts = [list(p) if isinstance(p, (list, tuple)) else p for p in kl_prompts or []]
        verdict.kl_source = "kl_prompts"
        if not prompts and fim_prompts:
            prompts = [tokenizer.encode(p, add_special_tokens=False) for p in fim_prompts]
            verdict.kl_source = "fim"
        # An empty completion is scored as [eos]: its one position is the next-token distribution.
        kl_samples = [Sample.build(prompt_token_ids=p, completion_token_ids=(), behaviour_logprobs=None, reward=0.0,
                                   where=f"kl prompt {i}") for i, p in enumerate(prompts)]
        if kl_samples:
            check_samples_against_vocab(kl_samples, vocab_size)
    stats = teacher_forced(model, kl_samples, CANDIDATE, parent, eos_id=eos_id, pad_id=pad_id,
                           max_prompt_tokens=config.max_prompt_tokens, max_tokens_per_pass=config.max_tokens_per_pass,
                           max_rows=config.batch_size, device=device)

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
        _reward_check(verdict, samples, stats, config,
                      thresholds=(candidate_show_threshold, parent_show_threshold), silence_reward=silence_reward)
    else:
        verdict.notes.append("off-policy reward not estimated: no held-out samples")

    if fim_cases:
        _fim_check(verdict, model, tokenizer, fim_prompts, fim_cases, parent, family, config,
                   eos_id=eos_id, pad_id=pad_id, device=device)

    verdict.passed = verdict.finite and FAILED not in (verdict.kl_check, verdict.reward_check, verdict.fim_check,
                                                       verdict.feedback_check)
    verdict.seconds = time.perf_counter() - started
    return verdict


def feedback_check(verdict: GateVerdict, events: Sequence[ShowEvent] | None, config: GateConfig) -> None:
    """Check 5 on ``verdict``: the window's shown suggestions against ``config.feedback_direction_z``
    (nothing without events or with the check off). The loop also calls it before training."""
    if events is None or not config.feedback_direction_z:
        return
    direction = feedback_direction(events)
    verdict.feedback_direction = direction
    if direction is None:
        verdict.notes.append(f"feedback direction not checked: under {MIN_ACCEPTED} accepted or under "
                             f"{MIN_ACCEPTED} other shown suggestions in the window")
        return
    if direction["z"] < -config.feedback_direction_z:
        verdict.feedback_check = FAILED
        verdict.reasons.append(
            f"the window's feedback runs against the model: its {direction['accepted']} accepted suggestions "
            f"scored lower than the {direction['others']} others (ROC AUC {direction['auc']:.2f}, "
            f"{-direction['z']:.1f} standard errors below 0.5); outcomes reported the wrong way round teach a "
            f"candidate to unlearn: check the client's accept and reject reports "
            f"and resend the wrong ones (a later occurred_at replaces each), or, where they cannot be resent, leave "
            f"this run's events out of training (its page, or POST /v1/training-runs/<id>/exclude-window); "
            f"gate_overrides.feedback_direction_z 0 turns this check off")
    else:
        verdict.feedback_check = PASSED


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


def _reward_check(verdict: GateVerdict, samples: list[Sample], stats: dict[str, Any], config: GateConfig, *,
                  thresholds: tuple[float | None, float | None], silence_reward: float) -> None:
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    # Silence ([eos]) never has a logged log-prob: the parent is assumed to have served it.
    logged = [s.behaviour_logprobs is not None and bool(s.completion_token_ids) for s in samples]
    served = torch.tensor([math.fsum(s.behaviour_logprobs) if known and s.behaviour_logprobs else 0.0
                           for s, known in zip(samples, logged, strict=True)], dtype=torch.float64)
    behaviour = torch.where(torch.tensor(logged), served, stats["logp_parent"])
    verdict.behaviour_known = sum(logged)
    # What serving's show filter judges: a completion (not an agent's turn, which carries its own
    # silence reward) that showed text. Withheld counts as silence; the few shown anyway to keep
    # the gate learning (explore, 5 % by default) are left out of this estimate.
    suggested = torch.tensor([bool(s.completion_token_ids) and not s.silent and s.silence_reward is None
                              for s in samples])
    as_served = {}
    for name, threshold in zip(("candidate", "parent"), thresholds, strict=True):
        withheld = torch.zeros_like(suggested)
        if threshold is not None:  # show_gate.withholds, over all samples at once
            withheld = suggested & (stats[f"logp_{name}"] < threshold)
        as_served[name] = torch.where(withheld, torch.tensor(silence_reward, dtype=torch.float64), rewards)
        setattr(verdict, f"withheld_{name}", int(withheld.sum()))
    candidate, verdict.effective_sample_size = off_policy_value(
        stats["logp_candidate"], behaviour, as_served["candidate"], cap=config.importance_cap)
    parent, _ = off_policy_value(stats["logp_parent"], behaviour, as_served["parent"], cap=config.importance_cap)
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
    # An adapter parent is also compared with the base model under it (one more greedy pass):
    # the tenant sees what the whole lineage has learned, not only the last step.
    models = [("candidate", CANDIDATE), ("parent", parent)] + ([("base", None)] if parent is not None else [])
    per_case = {}
    for name, adapter in models:
        with active_adapter(model, adapter):
            middles = greedy_completions(model, tokenizer, prompts, family=family, eos_id=eos_id, pad_id=pad_id,
                                         max_new_tokens=config.max_new_tokens,
                                         max_tokens_per_pass=config.max_tokens_per_pass,
                                         max_rows=config.batch_size, device=device)
        per_case[name] = fim_case_scores(middles, cases, family)
    verdict.fim_candidate, verdict.fim_parent = means(per_case["candidate"]), means(per_case["parent"])
    verdict.fim_count, verdict.fim_figures = len(cases), fim_figures(per_case)
    difference = verdict.fim_figures["lift"]["edit_similarity"]
    verdict.fim_rule, verdict.fim_check, reason = fim_decision(
        difference, candidate=verdict.fim_candidate["edit_similarity"],
        parent=verdict.fim_parent["edit_similarity"], config=config)
    bound = 0.0 - config.fim_margin  # 0.0, not −0.0
    verdict.fim_interval = {**difference, "bound": bound}
    if reason:
        verdict.reasons.append(reason)
    if verdict.fim_rule == MARGIN:
        verdict.notes.append(f"FIM check by the fixed margin {config.fim_margin:.3f}, not the paired interval: "
                             f"{len(cases)} case(s), fewer than {MIN_MEAN_INTERVAL_N}")


def fim_decision(difference: dict[str, Any], *, candidate: float, parent: float,
                 config: GateConfig) -> tuple[str, str, str | None]:
    """(rule, check, the reason when it fails) of the FIM check, from the paired edit-similarity
    difference candidate − parent (``{"value", "low", "high", "n"}``) and the two means.

    Paired: fails only when the difference's 95 % interval lies wholly below −``fim_margin``.
    A fixed margin on the means ignores how many cases there are and how much they vary: at a few
    dozen cases a 0.02 margin is inside the noise and stops sound rounds as often as bad ones,
    while the interval narrows with the cases and with how alike the two models' answers are
    (a candidate that changes a few cases moves little and is judged on those). Without an
    interval (under ``MIN_MEAN_INTERVAL_N`` cases) it falls back to the margin.
    """
    high = difference["high"]
    if high is None:
        if candidate < parent - config.fim_margin:
            return MARGIN, FAILED, (f"FIM edit similarity {candidate:.3f} is below the parent's {parent:.3f} "
                                    f"by more than the margin {config.fim_margin:.3f}")
        return MARGIN, PASSED, None
    if high < -config.fim_margin:
        return PAIRED, FAILED, (
            f"FIM edit similarity {candidate:.3f} is below the parent's {parent:.3f} on the eval set: the "
            f"paired difference {difference['value']:+.3f} [{difference['low']:+.3f}, {high:+.3f}] over "
            f"{difference['n']} cases lies wholly below {_below(config.fim_margin)}")
    return PAIRED, PASSED, None


def _below(margin: float) -> str:
    """What the interval was held to, in words: "0", or "-0.020" (a margin below the parent)."""
    return "0" if margin == 0 else f"-{margin:.3f}"
