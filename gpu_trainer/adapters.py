"""LoRA adapter directories: the format vLLM serves, checked on the way in and on the way out.

An adapter directory holds ``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT LoRA,
no bias, no ``modules_to_save``, no DoRA, rank within the serving limit) and, when Strop wrote
it, ``strop_train_config.json`` (the full config, the base model and its fingerprint) and
``metrics.jsonl``. A directory is written under a temporary name, verified, then renamed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from learning_shared.errors import AdapterInvalidError, AdapterWriteError
from learning_shared.fingerprint import base_model_fingerprint

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
TRAIN_CONFIG = "strop_train_config.json"
METRICS = "metrics.jsonl"


def verify_adapter(adapter_dir: str | Path, *, max_rank: int | None = None) -> dict[str, Any]:
    """Check that ``adapter_dir`` is a LoRA adapter vLLM can serve and whose weights are finite.

    Returns the adapter config. Raises ``AdapterInvalidError`` saying what is wrong.
    """
    import torch
    from safetensors import safe_open

    path = Path(adapter_dir)
    config_path, weights_path = path / ADAPTER_CONFIG, path / ADAPTER_WEIGHTS
    if not config_path.is_file() or not weights_path.is_file():
        raise AdapterInvalidError(f"adapter {path}: needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterInvalidError(f"adapter {path}: {ADAPTER_CONFIG} is not valid JSON: {exc}") from None
    problems = []
    if config.get("peft_type") != "LORA":
        problems.append(f"peft_type is {config.get('peft_type')!r}, not 'LORA'")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        problems.append("it trains biases (vLLM serves bias 'none' only)")
    if config.get("modules_to_save"):
        problems.append("it has modules_to_save (vLLM refuses them)")
    if config.get("use_dora"):
        problems.append("it is a DoRA adapter (vLLM serves plain LoRA)")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        problems.append("it has per-module rank/alpha patterns")
    unsupported = [
        k for k in ("alora_invocation_tokens", "layer_replication", "use_bdlora", "use_qalora") if config.get(k)
    ]
    if unsupported:
        problems.append(f"vLLM does not support {', '.join(unsupported)}")
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in ("gaussian", "eva", "orthogonal", "mica", "lora_ga"):
        problems.append(f"init_lora_weights={init!r} changes the base weights (vLLM refuses it)")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        problems.append(f"rank r={rank!r} is not a positive integer")
    elif max_rank is not None and rank > max_rank:
        problems.append(f"rank {rank} exceeds the serving limit {max_rank}")
    if problems:
        raise AdapterInvalidError(f"adapter {path}: " + "; ".join(problems))

    try:
        with safe_open(str(weights_path), framework="pt") as fh:
            keys = list(fh.keys())
            if not keys or not any("lora_A" in k for k in keys) or not any("lora_B" in k for k in keys):
                raise AdapterInvalidError(f"adapter {path}: {ADAPTER_WEIGHTS} holds no lora_A/lora_B weights")
            for key in keys:
                tensor = fh.get_tensor(key)
                if not torch.isfinite(tensor).all():
                    raise AdapterInvalidError(f"adapter {path}: tensor {key} has non-finite values")
    except AdapterInvalidError:
        raise
    except Exception as exc:  # safetensors raises its own error types for truncated/corrupt files
        raise AdapterInvalidError(f"adapter {path}: {ADAPTER_WEIGHTS} is unreadable ({exc})") from None
    return config


def read_train_config(adapter_dir: str | Path) -> dict[str, Any] | None:
    """The ``strop_train_config.json`` Strop wrote beside an adapter, if any."""
    path = Path(adapter_dir) / TRAIN_CONFIG
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def check_parent_matches_base(parent_dir: str | Path, base_model_dir: str | Path, base_fingerprint: str) -> None:
    """Refuse a parent adapter trained on another base model."""
    parent, base = Path(parent_dir), Path(base_model_dir)
    recorded = read_train_config(parent)
    if recorded and recorded.get("base_fingerprint"):
        if recorded["base_fingerprint"] != base_fingerprint:
            raise AdapterInvalidError(
                f"parent adapter {parent} was trained on base model {recorded.get('base_model')!r} "
                f"(fingerprint {recorded['base_fingerprint']}), not on {base} (fingerprint {base_fingerprint})"
            )
        return
    config = json.loads((parent / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    named = config.get("base_model_name_or_path")
    if named and Path(named).is_dir() and Path(named).resolve() != base.resolve():
        if base_model_fingerprint(named) != base_fingerprint:
            raise AdapterInvalidError(f"parent adapter {parent} names base model {named}, which differs from {base}")


def _out_of_space(exc: BaseException) -> bool:
    """A full disk, as Python reports it or as safetensors does (its writer is Rust: a
    ``SafetensorError`` whose message carries the OS error, not an ``OSError``)."""
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOSPC
    return f"(os error {errno.ENOSPC})" in str(exc)


def write_adapter_dir(out_dir: str | Path, write: Callable[[Path], None], *, max_rank: int) -> Path:
    """Run ``write(tmp_dir)``, verify the adapter in it, then rename it to ``out_dir``.

    Refuses an existing ``out_dir``: every adapter version gets its own directory (vLLM keys
    its prefix cache by path). On any failure nothing is left at ``out_dir``.
    """
    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(f"output directory {out} already exists; adapters are never overwritten")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        try:
            write(tmp)
        except Exception as exc:
            if _out_of_space(exc):
                raise AdapterWriteError(
                    errno.ENOSPC, f"no space left on device (ENOSPC) while writing the adapter to {out}: {exc}"
                ) from exc
            raise
        verify_adapter(tmp, max_rank=max_rank)
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; the vLLM server may run as another user
        for child in tmp.iterdir():
            os.chmod(child, 0o644)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
