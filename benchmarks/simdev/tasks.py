"""Completion tasks cut from real Python source that Strop's own training never saw.

The source is the pure-Python packages installed from ``requirements.lock`` (pinned, so every
machine cuts the same tasks). The starter model trains on the standard library, so no package
here copies it (``billiard``, a fork of ``multiprocessing``, is left out for that reason). A
pretrained base such as SmolLM2 has likely read these public packages; what the learning
benchmark needs is that the adapters never train on the eval packages. Train and eval are split
**by package**: no file, and no package, is in both.

* train: the web, task-queue and terminal stack (Django, DRF, Celery, Kombu, Jinja, Rich, ...);
* eval: HTTP clients, packaging, dates, JSON Schema, small utilities (httpx, packaging, ...).

A task is a cursor inside a line. The cursor sits right after a token (an identifier, keyword,
number, string, or an operator such as ``(``, ``=``, ``.``, ``,``), never at the start of the
line (at least one token of it is typed) and never inside a string or comment, with at least
``MIN_REST_CHARS`` non-blank characters left on the line. A line is a candidate when it is
12 to 100 characters long without its indentation, is code (not a comment, not part of a
multi-line string or docstring, does not start with a string, holds no comment) and is not blank.

Selection is deterministic under a seed and lazy: packages take turns, each visiting its files
in a seeded order and taking the next of a file's candidate lines (seeded order, one cursor per
line), so a larger ``count`` extends a smaller one with the same seed.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.metadata
import io
import json
import random
import sysconfig
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

Split = Literal["train", "eval"]
Population = Literal["line", "block"]

# import name -> distribution name (as pinned in requirements.lock)
TRAIN_PACKAGES: dict[str, str] = {
    "django": "Django",
    "rest_framework": "djangorestframework",
    "drf_spectacular": "drf-spectacular",
    "celery": "celery",
    "kombu": "kombu",
    "amqp": "amqp",
    "redis": "redis",
    "gunicorn": "gunicorn",
    "werkzeug": "Werkzeug",
    "jinja2": "Jinja2",
    "click": "click",
    "typer": "typer",
    "rich": "rich",
    "prompt_toolkit": "prompt_toolkit",
    "markdown_it": "markdown-it-py",
    "sqlparse": "sqlparse",
    "anyio": "anyio",
    "fsspec": "fsspec",
}
EVAL_PACKAGES: dict[str, str] = {
    "httpx": "httpx",
    "httpcore": "httpcore",
    "h11": "h11",
    "packaging": "packaging",
    "dateutil": "python-dateutil",
    "jsonschema": "jsonschema",
    "referencing": "referencing",
    "pluggy": "pluggy",
    "tqdm": "tqdm",
    "sortedcontainers": "sortedcontainers",
    "filelock": "filelock",
    "whitenoise": "whitenoise",
    "asgiref": "asgiref",
    "attr": "attrs",
}
SPLITS: dict[str, dict[str, str]] = {"train": TRAIN_PACKAGES, "eval": EVAL_PACKAGES}

# Folders that are tests, data or vendored copies rather than the package's own code.
SKIPPED_DIRS = frozenset({"tests", "test", "testing", "migrations", "locale", "_vendor", "vendor", "__pycache__"})
MAX_FILE_BYTES = 200_000
MIN_LINE_CHARS, MAX_LINE_CHARS = 12, 100
MIN_REST_CHARS = 4
CURSOR_TOKENS = frozenset({tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING})


@dataclass(frozen=True)
class Task:
    """One place where a developer pauses inside a line of a real file.

    ``prefix`` is the file up to the cursor (trimmed to whole lines of context);
    ``line_rest`` what is left of the line; ``block`` the rest of the line and the following
    lines of the same block (``line_rest`` alone when the line ends its block); ``suffix`` the
    file after ``line_rest`` and ``block_suffix`` the file after ``block`` (a few lines each).
    """

    id: str
    split: str
    package: str
    path: str  # relative to the folder the package is installed in
    line: int  # 1-based
    column: int  # the cursor, in characters from the start of the line
    prefix: str
    line_rest: str
    block: str
    suffix: str
    block_suffix: str
    language: str = "python"

    def middle(self, population: Population) -> str:
        """What a developer of ``population`` goes on to type."""
        return self.line_rest if population == "line" else self.block

    def suffix_for(self, population: Population) -> str:
        """The file after what a developer of ``population`` types."""
        return self.suffix if population == "line" else self.block_suffix


@dataclass(frozen=True)
class Context:
    """How much of the file a task carries around the cursor."""

    max_prefix_lines: int = 40
    max_prefix_chars: int = 1500
    suffix_lines: int = 4
    max_block_lines: int = 4  # lines after the cursor's line that a block may hold
    # Off unless set: a very long line (data, an embedded string) would otherwise put thousands of
    # characters before or after the cursor; set, only the nearest ones are sent, as editors do.
    max_typed_chars: int | None = None
    max_suffix_chars: int | None = None


def package_root(name: str) -> Path:
    """The installed folder of package ``name``, found on ``sys.path`` without importing it (and
    without asking ``sys.modules``: some packages, kombu, replace their module object)."""
    spec = importlib.machinery.PathFinder.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"package {name!r} is not installed (it is pinned in requirements.lock)")
    root = Path(next(iter(spec.submodule_search_locations))).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    if root.is_relative_to(stdlib) and "site-packages" not in root.parts:
        raise LookupError(f"{name!r} resolves to the standard library ({root}), which the starter model trains on")
    return root


def package_version(name: str) -> str:
    dist = {**TRAIN_PACKAGES, **EVAL_PACKAGES}[name]
    return importlib.metadata.version(dist)


def source_files(name: str) -> list[Path]:
    """The package's own ``.py`` files, sorted by their path inside the package."""
    return python_files(package_root(name))


def python_files(root: Path) -> list[Path]:
    """The ``.py`` files under ``root`` that are its own code (no tests, data or vendored copies,
    none over ``MAX_FILE_BYTES``), sorted by their path under ``root``."""
    files = [
        path
        for path in root.rglob("*.py")
        if not SKIPPED_DIRS.intersection(path.relative_to(root).parts[:-1]) and path.stat().st_size <= MAX_FILE_BYTES
    ]
    return sorted(files, key=lambda path: path.relative_to(root).as_posix())


def _line_tokens(source: str) -> tuple[dict[int, list[tokenize.TokenInfo]], frozenset[int]] | None:
    """Tokens by line number of the lines that are plain code, and the numbers of the lines that
    hold a comment or part of a multi-line string; None when the file does not tokenize."""
    by_line: dict[int, list[tokenize.TokenInfo]] = {}
    banned: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            start, end = token.start[0], token.end[0]
            if token.type == tokenize.COMMENT or start != end:
                banned.update(range(start, end + 1))
            elif token.type in CURSOR_TOKENS:
                by_line.setdefault(start, []).append(token)
    except (tokenize.TokenError, SyntaxError):
        return None
    return {number: tokens for number, tokens in by_line.items() if number not in banned}, frozenset(banned)


def _cursor_columns(text: str, tokens: list[tokenize.TokenInfo]) -> list[int]:
    """Columns right after a token of the line, leaving at least MIN_REST_CHARS to type."""
    stripped = text.strip()
    if not MIN_LINE_CHARS <= len(stripped) <= MAX_LINE_CHARS or tokens[0].type == tokenize.STRING:
        return []
    columns = sorted({token.end[1] for token in tokens})
    return [col for col in columns if len("".join(text[col:].split())) >= MIN_REST_CHARS]


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


@dataclass(frozen=True)
class _Source:
    lines: list[str]
    candidates: dict[int, list[int]]  # 0-based line index -> cursor columns
    not_code: frozenset[int]  # 0-based indexes of comment and multi-line string lines


def _cut(source: _Source, index: int, column: int, context: Context) -> tuple[str, str, str, str, str]:
    """(prefix, line_rest, block, suffix, block_suffix) for a cursor at ``lines[index][column]``.
    The block goes on over the following code lines indented at least as deep as the cursor's
    line; a blank line, a comment, a docstring or a dedent ends it."""
    lines = source.lines
    current = lines[index]
    head = lines[max(0, index - context.max_prefix_lines) : index]
    typed = current[:column]
    if context.max_typed_chars is not None:
        typed = typed[-context.max_typed_chars :] if context.max_typed_chars else ""
    while head and sum(len(line) + 1 for line in head) + len(typed) > context.max_prefix_chars:
        head = head[1:]
    prefix = "".join(line + "\n" for line in head) + typed
    line_rest = current[column:]
    following: list[str] = []
    for offset, line in enumerate(lines[index + 1 : index + 1 + context.max_block_lines], start=index + 1):
        if not line.strip() or offset in source.not_code or _indent(line) < _indent(current):
            break
        following.append(line)
    block = "\n".join([line_rest, *following])

    def after(end: int) -> str:
        text = "".join("\n" + line for line in lines[end : end + context.suffix_lines])
        return text if context.max_suffix_chars is None else text[: context.max_suffix_chars]

    return prefix, line_rest, block, after(index + 1), after(index + 1 + len(following))


@functools.lru_cache(maxsize=4096)
def _read_source(path: Path) -> _Source:
    """The file's lines and where tasks may be cut (cached: tokenizing is most of the cost)."""
    empty = _Source([], {}, frozenset())
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return empty
    tokenized = _line_tokens(text)
    if tokenized is None:
        return empty
    tokens, banned = tokenized
    lines = text.splitlines()
    candidates = {}
    for number, line_tokens in tokens.items():
        if number - 1 < len(lines):
            columns = _cursor_columns(lines[number - 1], line_tokens)
            if columns:
                candidates[number - 1] = columns
    return _Source(lines, candidates, frozenset(number - 1 for number in banned))


def _package_tasks(name: str, split: Split, seed: int, context: Context) -> Iterator[Task]:
    """The package's tasks in a seeded order: its files take turns, each giving its next line."""
    root = package_root(name)
    return file_tasks(source_files(name), root=root, label=root.name, package=name, split=split,
                      rng=random.Random(f"{seed}:{split}:{name}"), context=context)


def file_tasks(files: Iterable[Path], *, root: Path, label: str, package: str, split: str, rng: random.Random,
               context: Context) -> Iterator[Task]:
    """Tasks cut from ``files`` (under ``root``) in an ``rng`` order: the files take turns, each
    giving its next line. A task's path is ``label/<path under root>``."""
    files = list(files)
    rng.shuffle(files)
    pending: list[tuple[Path, _Source, list[tuple[int, int]]] | Path] = list(files)
    while pending:
        still: list[tuple[Path, _Source, list[tuple[int, int]]] | Path] = []
        for entry in pending:
            if isinstance(entry, Path):  # first visit: read the file, order its lines
                source = _read_source(entry)
                picks = [(index, rng.choice(columns)) for index, columns in sorted(source.candidates.items())]
                rng.shuffle(picks)
                entry = (entry, source, picks)
            path, source, picks = entry
            if not picks:
                continue
            index, column = picks.pop()
            prefix, line_rest, block, suffix, block_suffix = _cut(source, index, column, context)
            relative = f"{label}/{path.relative_to(root).as_posix()}"
            yield Task(
                id=f"{relative}:{index + 1}:{column}",
                split=split,
                package=package,
                path=relative,
                line=index + 1,
                column=column,
                prefix=prefix,
                line_rest=line_rest,
                block=block,
                suffix=suffix,
                block_suffix=block_suffix,
            )
            if picks:
                still.append(entry)
        pending = still


def iter_tasks(split: Split, *, seed: int = 0, context: Context | None = None) -> Iterator[Task]:
    """Every task of ``split``, packages taking turns (so none dominates), until all are used."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, not {split!r}")
    context = context or Context()
    streams = [_package_tasks(name, split, seed, context) for name in sorted(SPLITS[split])]
    while streams:
        alive = []
        for stream in streams:
            task = next(stream, None)
            if task is not None:
                yield task
                alive.append(stream)
        streams = alive


def load_tasks(split: Split, count: int, *, seed: int = 0, context: Context | None = None) -> list[Task]:
    """``count`` tasks of ``split`` (fewer only if the split has fewer), the same for the same seed."""
    if count < 0:
        raise ValueError("count must be >= 0")
    tasks: list[Task] = []
    for task in iter_tasks(split, seed=seed, context=context):
        if len(tasks) == count:
            break
        tasks.append(task)
    return tasks


# ---- JSONL: one task a line, {"prefix", "suffix", "middle", ...} for one population ----


def task_record(task: Task, population: Population) -> dict[str, object]:
    """The task as a population's case: ``prefix``/``suffix``/``middle`` (the shape of an adapter's
    eval set) plus every field of the task, so it reads back whole."""
    return {
        "prefix": task.prefix,
        "suffix": task.suffix_for(population),
        "middle": task.middle(population),
        "population": population,
        **{k: v for k, v in asdict(task).items() if k not in ("prefix", "suffix")},
        "line_suffix": task.suffix,
    }


def write_jsonl(path: str | Path, tasks: Iterable[Task], population: Population) -> int:
    """Write one record a line; returns how many."""
    written = 0
    with Path(path).open("w", encoding="utf-8") as out:
        for task in tasks:
            out.write(json.dumps(task_record(task, population), ensure_ascii=False) + "\n")
            written += 1
    return written


def read_jsonl(path: str | Path) -> list[Task]:
    """Tasks from a JSONL file: records written by :func:`write_jsonl` read back whole; a plain
    ``{"prefix", "suffix", "middle"}`` record (an eval-set case) is a task whose line rest is
    the middle's first line and whose block is the whole middle."""
    tasks = []
    names = {f.name for f in fields(Task)} - {"suffix"}
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        record = json.loads(raw)
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("prefix", "middle")):
            raise ValueError(f"{path}:{number}: a record is an object with string 'prefix' and 'middle'")
        if "line_rest" in record:
            tasks.append(Task(**{k: v for k, v in record.items() if k in names}, suffix=record["line_suffix"]))
            continue
        prefix, middle, suffix = record["prefix"], record["middle"], record.get("suffix", "")
        line_rest = middle.split("\n", 1)[0]
        tasks.append(
            Task(
                id=f"{Path(path).name}:{number}",
                split="file",
                package="",
                path="",
                line=0,
                column=len(prefix) - (prefix.rfind("\n") + 1),
                prefix=prefix,
                line_rest=line_rest,
                block=middle,
                suffix=middle[len(line_rest) :] + suffix,
                block_suffix=suffix,
            )
        )
    return tasks
