"""What the deploy checks read: the Dockerfiles, the compose files, the Procfile and the settings'
names, parsed once here so each test states only its rule. No container engine runs on this machine
or in CI: these checks are all the images and the compose file get before an operator builds them."""

from __future__ import annotations

import re
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "platform" / "docker"
COMPOSE = ROOT / "platform" / "compose.yaml"
COMPOSE_GPU = DOCKER / "compose.gpu.yaml"
COMPOSE_ONE_GPU = DOCKER / "compose.one-gpu.yaml"
COMPOSE_OVERRIDES = (COMPOSE_GPU, COMPOSE_ONE_GPU)
COMPOSE_ENV_EXAMPLE = ROOT / "platform" / "compose.env.example"
PROCFILE = ROOT / "platform" / "Procfile"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))

# Services that are not Strop's processes: the backing stores, and the one-shot jobs before them.
BACKING_SERVICES = {"postgres", "redis", "object-store"}
ONE_SHOTS = {"base-model", "store-init", "store-users", "migrate"}
# One-shot jobs that `up` never starts (a profile of their own): only `run` runs them.
ON_DEMAND = {"store-backup", "store-restore"}


def tool(name: str, package: str) -> str:
    """A command-line tool that a package of requirements.lock installs beside this Python."""
    found = Path(sys.executable).with_name(name)
    path = str(found) if found.exists() else shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} is missing: it comes with the PyPI package {package} (requirements.lock)")
    return path


def procfile() -> dict[str, str]:
    """platform/Procfile's processes: name -> command line."""
    entries = {}
    for line in PROCFILE.read_text().splitlines():
        match = re.match(r"^([a-z][a-z0-9-]*):\s*(.+)$", line)
        if match:
            entries[match.group(1)] = match.group(2)
    return entries


def compose(path: Path = COMPOSE) -> dict:
    """A compose file as compose reads it (YAML merge keys resolved; ${...} left as written)."""
    return yaml.safe_load(path.read_text())


# Compose's merge of several files (the Compose Specification's "merge" rules): mappings merge key by
# key, sequences append, and a service's command, entrypoint and healthcheck test replace the earlier.
def replaced_on_merge(path: tuple[str, ...]) -> bool:
    return path[-1:] in {("command",), ("entrypoint",)} or path[-2:] == ("healthcheck", "test")


def compose_merge(base: object, override: object, path: tuple[str, ...] = ()) -> object:
    """What ``docker compose -f base -f override config`` holds, before interpolation, for the
    attributes our files use (no ports or volumes in an override: those merge by keys of their own)."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = compose_merge(base[key], value, (*path, key)) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(override, list) and not replaced_on_merge(path):
        return base + override
    return override


def merged_services(*overrides: Path) -> dict[str, dict]:
    """The services of compose.yaml with these override files applied, in order."""
    merged: object = compose()
    for path in overrides:
        merged = compose_merge(merged, compose(path))
    assert isinstance(merged, dict)
    return merged["services"]


def pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@dataclass
class Stage:
    base: str
    name: str = ""
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def dockerfile_stages(path: Path) -> list[Stage]:
    """The stages of a Dockerfile, each with its instructions (continuation lines joined)."""
    logical, pending = [], ""
    for raw in path.read_text().splitlines():
        if not pending and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        logical.append(pending + raw)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.strip().partition(" ")
        keyword, args = keyword.upper(), " ".join(args.split())
        if keyword == "FROM":
            base, *name = re.split(r"\s+as\s+", args, flags=re.IGNORECASE)
            stages.append(Stage(base=base, name=name[0] if name else ""))
        elif stages:
            stages[-1].instructions.append((keyword, args))
    return stages
