"""The model cache: where built base models live, and the one way a model directory is built.

Every built model (the starter recipe, a dequantized GGUF) is an ordinary Hugging Face
directory under the cache root (``default_cache_root``), named after a hash of what determines its
bytes. It is built once: in a temporary directory renamed into place at the
end, under a file lock, so a crash never leaves half a model and concurrent builders (pytest-xdist,
two workers starting together) build it once.

No torch import here.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def default_cache_root() -> Path:
    """``$STROP_MODEL_CACHE``, else ``$STROP_VAR_DIR/models``, else the user's cache
    (``$XDG_CACHE_HOME/strop/models``, ``~/.cache/strop/models``): one per machine and user, so a
    second checkout (or CI's clean clone) reuses the models the first one built instead of spending
    minutes on them again. The directory names carry the hash of what made them, so sharing is safe."""
    explicit = os.environ.get("STROP_MODEL_CACHE")
    if explicit:
        return Path(explicit)
    var_dir = os.environ.get("STROP_VAR_DIR")
    if var_dir:
        return Path(var_dir) / "models"
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "strop" / "models"


def build_once(target: Path, build: Callable[[Path], object], *, key: str) -> Path:
    """``target``, after running ``build(tmp_dir)`` and renaming ``tmp_dir`` to it if it is new.

    ``target`` counts as built once it holds ``config.json``. ``key`` names the lock file
    (``.<key>.lock``) and the temporary directories (``.tmp-<key>-*``) beside it.
    """
    if (target / "config.json").is_file():
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    # One builder at a time; the rest wait, then find the directory built.
    with open(root / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():
            return target
        for stale in root.glob(f".tmp-{key}-*"):  # a builder killed mid-way; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
        try:
            build(tmp)
            make_world_readable(tmp)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def make_world_readable(directory: Path) -> None:
    """mkdtemp makes 0700 and safetensors 0600; the vLLM server may run as another user."""
    os.chmod(directory, 0o755)
    for child in directory.iterdir():
        os.chmod(child, 0o755 if child.is_dir() else 0o644)


def pin_tokenizer_class(model_dir: Path, *, max_length: int | None = None) -> None:
    """Make ``tokenizer_config.json`` loadable by vLLM's transformers as well as ours.

    transformers 5 writes its new backend class name; vLLM's pinned transformers may be older,
    and ``PreTrainedTokenizerFast`` loads ``tokenizer.json`` in both. ``max_length`` replaces a
    missing or unbounded ``model_max_length``.
    """
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if max_length is not None:
        config["model_max_length"] = max_length
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
