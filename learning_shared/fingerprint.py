"""A base model's identity, read from its files: what model supply records when it builds or
validates a base model, what the registry stores, and what the trainer checks a parent adapter
against (an adapter trained on one base is refused on another). Plain hashlib, no torch."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def base_model_fingerprint(base_model_dir: str | Path) -> str:
    """A cheap identity of a base model: its config and the heads and tails of its weight files.

    Hashing multi-GB weights in full costs seconds per run; the safetensors header (names,
    shapes, offsets) plus a MiB at each end tells different models apart in practice.
    """
    base = Path(base_model_dir)
    digest = hashlib.sha256()
    config = base / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for weights in sorted(base.glob("*.safetensors")) + sorted(base.glob("*.bin")):
        size = weights.stat().st_size
        digest.update(f"{weights.name}:{size}".encode())
        with open(weights, "rb") as fh:
            digest.update(fh.read(_CHUNK))
            if size > 2 * _CHUNK:
                fh.seek(size - _CHUNK)
                digest.update(fh.read(_CHUNK))
    return digest.hexdigest()[:16]
