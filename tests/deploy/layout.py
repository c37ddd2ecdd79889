"""What the deploy checks read: the Dockerfiles, the compose files, the Procfile and the settings'
names, parsed once here so each test states only its rule. No container engine runs on this machine
or in CI: these checks are all the images and the compose file get before an operator builds them."""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "platform" / "docker"
COMPOSE = ROOT / "platform" / "compose.yaml"
COMPOSE_GPU = DOCKER / "compose.gpu.yaml"
COMPOSE_ENV_EXAMPLE = ROOT / "platform" / "compose.env.example"
PROCFILE = ROOT / "platform" / "Procfile"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))

# Services that are not Strop's processes: the backing stores, and the one-shot jobs before them.
BACKING_SERVICES = {"postgres", "redis", "object-store"}
ONE_SHOTS = {"base-model", "store-init", "store-users", "migrate"}


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
