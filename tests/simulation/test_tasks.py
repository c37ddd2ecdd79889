"""Tasks cut from installed packages: deterministic, split by package, cursors inside code lines."""

from __future__ import annotations

import ast
import io
import json
import re
import sys
import sysconfig
import tokenize
from pathlib import Path

import pytest

from benchmarks.simdev import EVAL_PACKAGES, TRAIN_PACKAGES, Context, load_tasks, read_jsonl, write_jsonl
from benchmarks.simdev.tasks import MAX_LINE_CHARS, MIN_LINE_CHARS, MIN_REST_CHARS, package_root, source_files

REPO_ROOT = Path(__file__).resolve().parents[2]


def not_code_lines(lines: list[str]) -> set[int]:
    """Line numbers holding a comment or part of a multi-line string (a docstring)."""
    tokens = tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
    return {
        number
        for token in tokens
        if token.type == tokenize.COMMENT or token.start[0] != token.end[0]
        for number in range(token.start[0], token.end[0] + 1)
    }


@pytest.fixture(scope="module")
def sample() -> list:
    return load_tasks("train", 60, seed=11) + load_tasks("eval", 60, seed=11)


def test_the_same_seed_gives_the_same_tasks_and_a_larger_count_extends_a_smaller_one():
    first = load_tasks("eval", 30, seed=3)
    assert first == load_tasks("eval", 30, seed=3)
    assert load_tasks("eval", 45, seed=3)[:30] == first
    assert [t.id for t in load_tasks("eval", 30, seed=4)] != [t.id for t in first]
    assert len({t.id for t in first}) == 30


def test_packages_take_turns_so_no_package_dominates():
    tasks = load_tasks("train", 2 * len(TRAIN_PACKAGES), seed=0)
    assert {t.package for t in tasks[: len(TRAIN_PACKAGES)]} == set(TRAIN_PACKAGES)


def test_train_and_eval_share_no_package_and_no_file():
    assert not set(TRAIN_PACKAGES) & set(EVAL_PACKAGES)
    files = {
        split: {f for name in packages for f in source_files(name)}
        for split, packages in (("train", TRAIN_PACKAGES), ("eval", EVAL_PACKAGES))
    }
    assert files["train"] and files["eval"] and not files["train"] & files["eval"]
    roots = {name: package_root(name) for name in {**TRAIN_PACKAGES, **EVAL_PACKAGES}}
    assert not any(a != b and roots[a].is_relative_to(roots[b]) for a in roots for b in roots)


def test_every_package_is_pinned_in_the_lock_and_none_is_the_standard_library():
    pinned = {
        re.split("==", line)[0].lower().replace("_", "-")
        for line in (REPO_ROOT / "requirements.lock").read_text().splitlines()
        if "==" in line
    }
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    for name, dist in {**TRAIN_PACKAGES, **EVAL_PACKAGES}.items():
        assert dist.lower().replace("_", "-") in pinned, dist
        assert "site-packages" in package_root(name).parts and not package_root(name).parent == stdlib


def test_every_task_comes_from_its_split_and_its_file_at_a_cursor_inside_a_code_line(sample):
    for task in sample:
        assert task.package in (TRAIN_PACKAGES if task.split == "train" else EVAL_PACKAGES)
        lines = (package_root(task.package).parent / task.path).read_text(encoding="utf-8").splitlines()
        line = lines[task.line - 1]
        typed = line[: task.column]
        assert task.prefix.endswith("\n" + typed) or task.prefix == typed
        assert task.line_rest == line[task.column :]
        assert typed.strip(), "the cursor is never at the start of the line"
        assert not (re.match(r"\w", task.line_rest) and re.search(r"\w$", typed)), "never inside a name"
        assert MIN_LINE_CHARS <= len(line.strip()) <= MAX_LINE_CHARS
        assert not line.lstrip().startswith(("#", '"', "'")) and task.line not in not_code_lines(lines)
        assert len("".join(task.line_rest.split())) >= MIN_REST_CHARS


def test_the_block_is_the_rest_of_the_line_and_the_following_lines_of_the_same_block(sample):
    multi_line = 0
    for task in sample:
        lines = (package_root(task.package).parent / task.path).read_text(encoding="utf-8").splitlines()
        indent = len(lines[task.line - 1]) - len(lines[task.line - 1].lstrip())
        rest = task.block.split("\n")
        assert rest[0] == task.line_rest and len(rest) <= 1 + Context().max_block_lines
        assert rest[1:] == lines[task.line : task.line + len(rest) - 1]
        assert all(row.strip() and len(row) - len(row.lstrip()) >= indent for row in rest[1:])
        assert task.suffix == "".join("\n" + row for row in lines[task.line : task.line + Context().suffix_lines])
        after = task.line + len(rest) - 1
        assert task.block_suffix == "".join("\n" + row for row in lines[after : after + Context().suffix_lines])
        multi_line += len(rest) > 1
    assert 0 < multi_line < len(sample), "both single-line and multi-line blocks occur"


def test_the_prefix_is_trimmed_to_whole_lines_of_context():
    context = Context(max_prefix_lines=6, max_prefix_chars=200)
    for task in load_tasks("eval", 20, seed=1, context=context):
        head = task.prefix.split("\n")
        assert len(head) <= 7
        assert len(task.prefix) <= 200 or len(head) == 1


def test_jsonl_round_trips_tasks_with_each_populations_middle(tmp_path):
    tasks = load_tasks("eval", 8, seed=2)
    for population in ("line", "block"):
        path = tmp_path / f"{population}.jsonl"
        assert write_jsonl(path, tasks, population) == 8
        records = [json.loads(row) for row in path.read_text().splitlines()]
        assert [r["middle"] for r in records] == [t.middle(population) for t in tasks]
        assert [r["suffix"] for r in records] == [t.suffix_for(population) for t in tasks]
        assert read_jsonl(path) == tasks


def test_a_plain_eval_case_reads_as_a_task_whose_block_is_its_middle(tmp_path):
    path = tmp_path / "cases.jsonl"
    case = {"prefix": "def f(x):\n    y =", "suffix": "\n    return y", "middle": " x + 1\n    y *= 2"}
    path.write_text(json.dumps(case) + "\n\n")
    (task,) = read_jsonl(path)
    assert (task.line_rest, task.block, task.column) == (" x + 1", " x + 1\n    y *= 2", 7)
    assert task.suffix == "\n    y *= 2\n    return y" and task.block_suffix == "\n    return y"
    path.write_text(json.dumps({"prefix": "x"}) + "\n")
    with pytest.raises(ValueError, match="cases.jsonl:1"):
        read_jsonl(path)


def test_the_command_line_writes_a_split_for_a_population(tmp_path, capsys):
    from benchmarks.simdev.__main__ import main

    main(
        [
            "write",
            "--split",
            "eval",
            "--count",
            "5",
            "--seed",
            "2",
            "--population",
            "line",
            "--out",
            str(tmp_path / "e.jsonl"),
        ]
    )
    assert "wrote 5 eval tasks" in capsys.readouterr().out
    assert read_jsonl(tmp_path / "e.jsonl") == load_tasks("eval", 5, seed=2)


def test_the_package_talks_to_strop_only_through_the_sdk():
    # learning_shared: Strop's pure, torch-free functions (the edit-distance measure of what a
    # developer kept), which reach no database, process or endpoint of Strop's.
    allowed = {"strop", "tqdm", "learning_shared"} | set(sys.stdlib_module_names)
    for path in (REPO_ROOT / "benchmarks" / "simdev").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            assert all(name.split(".")[0] in allowed for name in names), (path.name, names)
