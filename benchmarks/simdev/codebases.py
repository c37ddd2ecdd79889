"""A tenant's codebase as a folder of Python files: its tasks, split into training and unseen files.

The specialisation benchmark gives each simulated tenant a codebase of its own. Its files are
split once, by a seeded hash of each file's path under the folder (``split_of``): about
``unseen_share`` of the files are *unseen* (the tenant's new files, never trained on), the rest
are *training* files. A file is wholly on one side, so no line of an unseen file is ever in a
training window, and the split of a file never depends on which other files the folder holds.
Tasks are cut from each side as ``tasks.py`` cuts them from a package (``file_tasks``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from .tasks import Context, Task, file_tasks, python_files

Side = Literal["training", "unseen"]
SIDES: tuple[Side, ...] = ("training", "unseen")
DEFAULT_UNSEEN_SHARE = 0.3


def split_of(relative_path: str, *, seed: int, unseen_share: float = DEFAULT_UNSEEN_SHARE) -> Side:
    """Which side a file is on: a seeded hash of its path under the codebase's folder, read as a
    number in [0, 1), below ``unseen_share`` is unseen."""
    if not 0.0 < unseen_share < 1.0:
        raise ValueError(f"unseen_share must be within (0, 1), not {unseen_share}")
    digest = hashlib.sha256(f"{seed}:{relative_path}".encode()).digest()
    return "unseen" if int.from_bytes(digest[:8], "big") / 2**64 < unseen_share else "training"


@dataclass(frozen=True)
class Codebase:
    """A tenant's codebase: ``name`` (the tenant) and the folder ``root`` of its Python files."""

    name: str
    root: Path
    seed: int = 0
    unseen_share: float = DEFAULT_UNSEEN_SHARE

    @classmethod
    def parse(cls, spec: str, *, seed: int = 0, unseen_share: float = DEFAULT_UNSEEN_SHARE) -> Codebase:
        """``NAME=DIR`` as the command line gives it; a ``ValueError`` says what is wrong."""
        name, sep, folder = spec.partition("=")
        name = name.strip()
        if not sep or not name or not folder:
            raise ValueError(f"--codebase {spec!r}: expected NAME=DIR")
        if not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"--codebase {spec!r}: the name may hold letters, digits, '-' and '_' only")
        root = Path(folder).expanduser().resolve()
        if not root.is_dir():
            raise ValueError(f"--codebase {spec!r}: {folder} is not a folder")
        codebase = cls(name, root, seed, unseen_share)
        if not codebase.files("training") or not codebase.files("unseen"):
            raise ValueError(f"--codebase {spec!r}: {len(codebase.all_files)} Python files in {folder}, too few "
                             "to have both training and unseen files")
        return codebase

    @cached_property
    def all_files(self) -> list[Path]:
        return python_files(self.root)

    def side_of(self, path: Path) -> Side:
        return split_of(path.relative_to(self.root).as_posix(), seed=self.seed, unseen_share=self.unseen_share)

    def files(self, side: Side) -> list[Path]:
        """The files on ``side``, sorted by their path under the folder."""
        return [path for path in self.all_files if self.side_of(path) == side]

    def iter_tasks(self, side: Side, *, seed: int, context: Context | None = None) -> Iterator[Task]:
        """Every task of the files on ``side``, in a seeded order (the files take turns)."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}")
        return file_tasks(self.files(side), root=self.root, label=self.name, package=self.name, split=side,
                          rng=random.Random(f"{seed}:{side}:{self.name}"), context=context or Context())

    def tasks(self, side: Side, count: int, *, seed: int, context: Context | None = None) -> list[Task]:
        """``count`` tasks of ``side`` (fewer only if its files hold fewer), the same for the same seed."""
        if count < 0:
            raise ValueError("count must be >= 0")
        out: list[Task] = []
        for task in self.iter_tasks(side, seed=seed, context=context):
            if len(out) == count:
                break
            out.append(task)
        return out
