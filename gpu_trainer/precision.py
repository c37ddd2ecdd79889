"""Where the trainer's passes run and in what precision: device and dtype, bf16 autocast."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from gpu_trainer.config import PPOConfig


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
