"""The policy: a base causal LM with a LoRA adapter, its batches, and its completion log-probs.

Shared by PPO, GRPO and scoring: one way to seed, load, batch and compute log-probs.
Works for any local HF causal LM directory; token ids and sizes are read, never assumed.
"""

from __future__ import annotations

import random
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


def completion_logprobs(model, batch: PaddedBatch, *, with_entropy: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completion tokens under ``model`` ([B, W], zero off-mask), and the
    per-token entropy of the policy there (detached) when asked.

    The one log-prob function of the trainer: old, new, reference and scoring all use it.
    """
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  position_ids=batch.position_ids, use_cache=False)
    try:
        out = model(**inputs, logits_to_keep=batch.width + 1)
    except TypeError:  # an architecture without logits_to_keep: full logits, same slice below
        out = model(**inputs)
    logits = out.logits[:, -(batch.width + 1):-1, :].float()  # position t predicts token t+1
    log_probs = torch.log_softmax(logits, dim=-1)
    token_logprobs = log_probs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) * batch.mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(-1) * batch.mask
    return token_logprobs, entropy
