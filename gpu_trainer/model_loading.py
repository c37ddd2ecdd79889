"""The policy's model: seeding, the frozen base model and its tokenizer, and the trainable LoRA
on it (fresh, or the parent adapter's weights).

Works for any local HF causal LM directory; token ids and sizes are read, never assumed.
transformers and peft are imported inside the functions that load with them: importing this
module costs only torch.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils.deterministic

from gpu_trainer.adapters import check_parent_matches_base, verify_adapter
from gpu_trainer.config import PPOConfig
from gpu_trainer.precision import resolve_device_dtype
from learning_shared.errors import AdapterInvalidError, TrainerInputError
from learning_shared.fingerprint import base_model_fingerprint

logger = logging.getLogger(__name__)

CUBLAS_WORKSPACE = ":4096:8"
"""The cuBLAS workspace setting under which its matrix products are deterministic on CUDA ≥ 10.2
(PyTorch's reproducibility notes; cuBLAS's "Results reproducibility")."""


def deterministic_cublas() -> None:
    """Set ``CUBLAS_WORKSPACE_CONFIG`` for deterministic cuBLAS, unless the environment sets it.

    cuBLAS (and torch's workspace for it) reads the variable once per process, at its first
    matrix product on CUDA: set here, before the base model is loaded, it holds for a process
    whose first CUDA work is a training run or a gate. Where CUDA already ran in this process it
    may come too late, and that is logged: the worker's environment should then set it."""
    if "CUBLAS_WORKSPACE_CONFIG" in os.environ:
        return
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    if torch.cuda.is_initialized():
        logger.warning(
            "CUBLAS_WORKSPACE_CONFIG set after CUDA started in this process: cuBLAS may not be deterministic "
            "(set CUBLAS_WORKSPACE_CONFIG=%s in the environment)",
            CUBLAS_WORKSPACE,
        )


def seed_everything(seed: int, *, deterministic: bool) -> None:
    """The one seeding block: Python, torch (CPU and CUDA) and deterministic kernels (cuBLAS's
    workspace setting included, before CUDA starts)."""
    if deterministic:
        deterministic_cublas()
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    # Deterministic mode fills fresh tensors with NaN by default; that costs ~2x on CPU and
    # buys nothing here (no kernel reads uninitialised memory).
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]  # set at run time


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
    model.to(device)  # type: ignore[arg-type]  # transformers' stub of .to() takes a model
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
            lora_alpha=config.lora_alpha,  # type: ignore[arg-type]  # peft takes a float (its scaling divides by r)
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
