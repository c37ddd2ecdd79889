"""The policy: a base causal LM with a LoRA adapter, its batches, and its completion log-probs.

Shared by PPO, GRPO, scoring and the gate: one way to seed, load, batch and compute log-probs.
Works for any local HF causal LM directory; token ids and sizes are read, never assumed.

Memory is bounded by a token budget, not by the number of samples: ``plan_micro_batches`` cuts
a set of samples into forward passes of at most ``max_tokens`` tokens each (rows × padded
length), shortest first so that similar lengths share a pass. The activations of one pass grow
with its tokens (SmolLM2-135M: ~1.2 MB per token with grad), so the budget bounds them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils.deterministic

from gpu_trainer.adapters import check_parent_matches_base, verify_adapter
from gpu_trainer.config import PPOConfig
from gpu_trainer.errors import AdapterInvalidError, TrainerInputError
from gpu_trainer.samples import Sample


def seed_everything(seed: int, *, deterministic: bool) -> None:
    """The one seeding block: Python, torch (CPU and CUDA) and deterministic kernels."""
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    # Deterministic mode fills fresh tensors with NaN by default; that costs ~2x on CPU and
    # buys nothing here (no kernel reads uninitialised memory).
    torch.utils.deterministic.fill_uninitialized_memory = False


def _glibc_malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _glibc_malloc_trim()


def release_freed_memory() -> None:
    """Give the memory freed by the pass that just ended back to the OS (glibc ``malloc_trim``).

    PyTorch's CPU allocator has no cache: activations are malloc'd and freed every pass, and
    glibc keeps freed heap memory for reuse. With passes of changing shapes the heap fragments,
    and a trainer's resident memory climbed pass after pass (SmolLM2: 3.5 GB after five
    1,024-token passes, still rising) instead of staying at what one pass holds. Trimming after
    each pass costs ~6% of a pass's CPU time here. (A fixed 1 MiB mmap threshold bounds memory
    tighter but costs ~45%: every large tensor then page-faults fresh memory.) No-op without glibc.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def resolve_device_dtype(config: PPOConfig) -> tuple[torch.device, torch.dtype]:
    """cuda if available (bf16), else cpu (fp32), unless the config says otherwise."""
    if config.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(config.device)
    if config.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, config.dtype)
    return device, dtype


def bf16_is_native(device: torch.device, *, cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether bf16 matrix products run natively on ``device``: a GPU that supports bf16, or a CPU
    with AMX or AVX-512 bf16 instructions. Elsewhere autocast emulates them, many times slower
    than fp32 (an AMD EPYC without them trained 10x slower under autocast)."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as lines:
            flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    except OSError:  # not Linux: no way to tell here, so no autocast
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def autocast_setting(value: str | bool | None, device: torch.device) -> bool:
    """A deployment's autocast setting (true, false, or ``auto``/None: where bf16 is native)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return bf16_is_native(device)
    if isinstance(value, bool):
        return value
    return value.strip().lower() in {"1", "true", "yes", "on"}


def forward_precision(config: PPOConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """The context every forward pass of a training run runs in: bf16 autocast when the config
    asks for it, else nothing (the model's own dtype)."""
    if config.autocast_bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def load_tokenizer(base_model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(base_model_dir))


def load_base_model(base_model_dir: str | Path, device: torch.device, dtype: torch.dtype):
    """The frozen base model, in ``dtype`` on ``device``."""
    from transformers import AutoModelForCausalLM

    path = Path(base_model_dir)
    if not (path / "config.json").is_file():
        raise TrainerInputError(f"base model {path}: not a Hugging Face model directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.to(device)
    model.requires_grad_(False)
    return model


def special_token_ids(tokenizer, model) -> tuple[int, int]:
    """(eos_id, pad_id) from the tokenizer (the model config as a fallback); pad falls back to eos."""
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        eos_id = model.config.eos_token_id
        if isinstance(eos_id, list):
            eos_id = eos_id[0]
    if eos_id is None:
        raise TrainerInputError("base model: its tokenizer declares no EOS token, so silence cannot be trained")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    return int(eos_id), int(pad_id)


def enable_gradient_checkpointing(model) -> None:
    """Keep only each layer's input for the backward pass and recompute the rest: activations
    shrink from ~all of a layer's intermediates to one hidden vector per token and layer, for
    about one more forward pass of compute. Applies in train mode only (old, reference and
    scoring passes run in eval mode and keep nothing anyway)."""
    # Non-reentrant checkpointing needs no input that requires grad (the embeddings are frozen).
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def attach_lora(model, config: PPOConfig, *, base_model_dir: Path, base_fingerprint: str,
                parent_adapter_dir: str | Path | None):
    """Wrap ``model`` in a trainable LoRA: the parent adapter's weights, or a fresh one."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if parent_adapter_dir is not None:
        parent = Path(parent_adapter_dir)
        verify_adapter(parent, max_rank=config.max_lora_rank)
        check_parent_matches_base(parent, base_model_dir, base_fingerprint)
        try:
            peft_model = PeftModel.from_pretrained(model, str(parent), is_trainable=True)
        except (RuntimeError, ValueError, KeyError) as exc:  # shape mismatch: another base model
            raise AdapterInvalidError(
                f"parent adapter {parent} does not fit base model {base_model_dir}: {exc}"
            ) from None
    else:
        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=list(config.lora_target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )
        try:
            peft_model = get_peft_model(model, lora)
        except ValueError as exc:  # no module matched the targets
            raise TrainerInputError(f"config: lora_target_modules: {exc}") from None
    peft_model.peft_config["default"].base_model_name_or_path = str(base_model_dir)
    return peft_model


def adapter_is_identity(peft_model) -> bool:
    """True when every lora_B is zero: the policy equals the base model exactly."""
    return all(
        not p.any() for name, p in peft_model.named_parameters() if "lora_B" in name
    )


@dataclass
class PaddedBatch:
    """Left-padded prompt+completion sequences; completions end-aligned in the last ``width`` slots.

    Left padding puts every completion at the end, so the model computes logits for only the
    last ``width + 1`` positions (``logits_to_keep``) instead of the whole sequence.
    """

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T]
    targets: torch.Tensor  # [B, W] completion token ids, end-aligned
    mask: torch.Tensor  # [B, W] float, 1 on completion tokens
    behaviour_logprobs: torch.Tensor  # [B, W], 0 where unknown
    behaviour_mask: torch.Tensor  # [B, W] float, 1 where the serving logprob is known
    num_tokens: int  # non-pad tokens in the batch (prompt + completion)

    @property
    def width(self) -> int:
        return self.targets.shape[1]


def completion_tokens(sample: Sample, eos_id: int) -> tuple[int, ...]:
    """The tokens the trainer learns on: the served ones, or ``[eos]`` for silence."""
    return sample.completion_token_ids or (eos_id,)


def sequence_length(sample: Sample, *, eos_id: int, max_prompt_tokens: int) -> int:
    """Tokens of ``sample`` in a forward pass: its (truncated) prompt plus its completion."""
    return min(len(sample.prompt_token_ids), max_prompt_tokens) + len(completion_tokens(sample, eos_id))


def plan_micro_batches(lengths: Sequence[int], indices: Sequence[int], *, max_tokens: int,
                       max_rows: int | None = None) -> list[list[int]]:
    """Cut ``indices`` (into ``lengths``) into forward passes of at most ``max_tokens`` tokens,
    padding included (rows × longest row), and at most ``max_rows`` rows.

    Sorted by length first (ties by index, so the plan is deterministic): a pass then holds
    similar lengths and pads little. A sequence longer than ``max_tokens`` gets a pass of its own.
    """
    ordered = sorted(indices, key=lambda i: (lengths[i], i))
    passes: list[list[int]] = []
    current: list[int] = []
    for index in ordered:
        # Ascending order: the row being added is the longest of its pass.
        rows = len(current) + 1
        if current and (rows * lengths[index] > max_tokens or (max_rows is not None and rows > max_rows)):
            passes.append(current)
            current = []
        current.append(index)
    if current:
        passes.append(current)
    return passes


def make_batch(samples: list[Sample], *, eos_id: int, pad_id: int, max_prompt_tokens: int,
               device: torch.device) -> PaddedBatch:
    """Pad ``samples`` into one batch (prompts truncated from the left)."""
    completions = [completion_tokens(s, eos_id) for s in samples]
    sequences = [
        list(s.prompt_token_ids[-max_prompt_tokens:]) + list(c)
        for s, c in zip(samples, completions, strict=True)
    ]
    length = max(len(seq) for seq in sequences)
    width = max(len(c) for c in completions)
    batch = len(samples)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    mask = torch.zeros((batch, width))
    behaviour = torch.zeros((batch, width))
    behaviour_mask = torch.zeros((batch, width))
    for row, (sample, seq, comp) in enumerate(zip(samples, sequences, completions, strict=True)):
        input_ids[row, length - len(seq):] = torch.tensor(seq)
        attention_mask[row, length - len(seq):] = 1
        mask[row, width - len(comp):] = 1
        if sample.behaviour_logprobs is not None:
            behaviour[row, width - len(comp):] = torch.tensor(sample.behaviour_logprobs)
            behaviour_mask[row, width - len(comp):] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return PaddedBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids.to(device),
        targets=input_ids[:, length - width:].to(device),
        mask=mask.to(device),
        behaviour_logprobs=behaviour.to(device),
        behaviour_mask=behaviour_mask.to(device),
        num_tokens=int(attention_mask.sum()),
    )


def completion_logits(model, batch: PaddedBatch) -> torch.Tensor:
    """Logits at the completion positions only, [B, W, V] in fp32: position t predicts token t+1,
    and ``logits_to_keep`` spares the LM head every prompt position."""
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  position_ids=batch.position_ids, use_cache=False)
    try:
        out = model(**inputs, logits_to_keep=batch.width + 1)
    except TypeError:  # an architecture without logits_to_keep: full logits, same slice below
        out = model(**inputs)
    return out.logits[:, -(batch.width + 1):-1, :].float()


def chosen_token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), logsumexp) at every position of ``logits`` [B, W, V], without a
    [B, W, V] log-softmax: the chosen logit minus the logsumexp (the idea of TRL's selective
    log-softmax). The logsumexp goes row by row, so its temporaries are [W, V] at most."""
    lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse, lse


def entropy_from_logits(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Per-position entropy [B, W] (detached), computed row by row: [W, V] temporaries at most."""
    with torch.no_grad():
        rows = []
        for row_logits, row_lse in zip(logits.detach(), lse.detach(), strict=True):
            log_probs = row_logits - row_lse.unsqueeze(-1)
            rows.append(-(log_probs.exp() * log_probs).sum(-1))
        return torch.stack(rows)


def completion_logprobs(model, batch: PaddedBatch, *, with_entropy: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completion tokens under ``model`` ([B, W], zero off-mask), and the
    per-token entropy of the policy there (detached) when asked.

    The one log-prob function of the trainer: old, new, reference and scoring all use it.
    """
    logprobs, entropy, _ = _logprobs_from_logits(completion_logits(model, batch), batch, with_entropy)
    return logprobs, entropy


def completion_and_silence_logprobs(model, batch: PaddedBatch, *, silent_ids: torch.Tensor, with_entropy: bool = False
                                    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``completion_logprobs`` plus, from the same forward pass, the log-probability that the first
    token is one of ``silent_ids`` at each row's first completion position ([B]): the probability
    of showing nothing where the served completion began."""
    logits = completion_logits(model, batch)
    logprobs, entropy, lse = _logprobs_from_logits(logits, batch, with_entropy)
    rows = torch.arange(logits.shape[0], device=logits.device)
    first = batch.width - batch.mask.sum(-1).long()  # completions are end-aligned
    silent = torch.logsumexp(logits[rows, first][:, silent_ids], dim=-1) - lse[rows, first]
    return logprobs, entropy, silent


def _logprobs_from_logits(logits: torch.Tensor, batch: PaddedBatch, with_entropy: bool
                          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    token_logprobs, lse = chosen_token_logprobs(logits, batch.targets)
    entropy = entropy_from_logits(logits, lse) * batch.mask if with_entropy else None
    return token_logprobs * batch.mask, entropy, lse
