"""The specialisation benchmark: a codebase's files split by a seeded hash of their path, tasks cut
from one side only, and the whole loop through main() on the tiny starter model (its figures are
present and well-formed; their values are not the point here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import specialise
from benchmarks.simdev.codebases import Codebase, split_of

FIGURE = re.compile(r"^([A-Za-z0-9_-]+\.[a-z0-9_]+): (-?\d+(?:\.\d+)?|nan|inf)$")


def write_codebase(root: Path, files: int) -> Path:
    """A folder of small Python modules, each with a few candidate lines for tasks."""
    for number in range(files):
        package = root / f"pkg{number % 3}"
        package.mkdir(parents=True, exist_ok=True)
        (package / f"module_{number}.py").write_text(
            f"def compute_{number}(values, offset):\n"
            f"    total = sum(value * {number + 2} for value in values)\n"
            f"    result = total + offset - len(values)\n"
            f"    return result if result > 0 else offset\n"
        )
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "test_skipped.py").write_text("assert compute_1([1, 2, 3], offset=4) == 8\n")
    return root


def test_a_file_side_is_a_seeded_hash_of_its_path_alone():
    paths = [f"pkg/module_{i}.py" for i in range(2000)]
    sides = [split_of(p, seed=0, unseen_share=0.3) for p in paths]
    assert sides == [split_of(p, seed=0, unseen_share=0.3) for p in paths]  # the same every time
    assert 0.26 < sides.count("unseen") / len(paths) < 0.34
    assert sides != [split_of(p, seed=1, unseen_share=0.3) for p in paths]  # another seed, another split
    with pytest.raises(ValueError, match="unseen_share"):
        split_of("a.py", seed=0, unseen_share=1.0)


def test_tasks_come_only_from_their_side_and_no_file_is_on_both(tmp_path):
    codebase = Codebase.parse(f"acme={write_codebase(tmp_path / 'acme', 40)}")
    training, unseen = set(codebase.files("training")), set(codebase.files("unseen"))
    assert training and unseen and not training & unseen
    assert training | unseen == set(codebase.all_files)
    assert all("tests" not in path.parts for path in codebase.all_files)  # tests are not the codebase's own code
    for side, files in (("training", training), ("unseen", unseen)):
        tasks = codebase.tasks(side, 30, seed=3)
        assert tasks and all(t.split == side and t.package == "acme" for t in tasks)
        assert {t.path for t in tasks} <= {f"acme/{p.relative_to(codebase.root).as_posix()}" for p in files}
        assert [t.id for t in codebase.tasks(side, 30, seed=3)] == [t.id for t in tasks]
    # A file keeps its side when the folder gains files.
    write_codebase(tmp_path / "acme", 60)
    grown = Codebase.parse(f"acme={tmp_path / 'acme'}")
    assert {p for p in grown.files("unseen") if p in training | unseen} == unseen


def test_a_bad_codebase_argument_says_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="NAME=DIR"):
        Codebase.parse(str(tmp_path))
    with pytest.raises(ValueError, match="not a folder"):
        Codebase.parse(f"acme={tmp_path / 'missing'}")
    with pytest.raises(ValueError, match="letters, digits"):
        Codebase.parse(f"a.b={tmp_path}")
    with pytest.raises(ValueError, match="too few"):
        Codebase.parse(f"acme={write_codebase(tmp_path / 'one', 1)}")


def test_two_tenants_run_the_loop_and_every_tenant_gets_its_figures(tiny_starter_model, tmp_path, capsys):
    argv = ["--model", str(tiny_starter_model), "--codebase", f"north={write_codebase(tmp_path / 'north', 24)}",
            "--codebase", f"south={write_codebase(tmp_path / 'south', 24)}", "--train-tasks", "6",
            "--eval-tasks", "5", "--rounds", "2", "--set", "epochs=1", "--set", "num_minibatches=1",
            "--max-tokens", "6", "--heldout-fraction", "0.3", "--eval-each-round", "--poison-round", "2",
            "--eval-set-cases", "3", "--gate-history", "4", "--round-set", "1:learning_rate=2e-3", "--jobs", "2",
            "--device", "cpu",
            "--out", str(tmp_path / "out")]
    assert specialise.main(argv) == 0
    text = capsys.readouterr().out
    values = {}
    for line in text.rstrip("\n").rsplit("\n\n", 1)[1].splitlines():
        match = FIGURE.match(line)
        assert match, f"malformed figure line {line!r}"
        values[match.group(1)] = float(match.group(2))
    for tenant, other in (("north", "south"), ("south", "north")):
        assert f"== {tenant}: its own unseen files (5 tasks) ==" in text
        for key in ("own_version_accepted_per_request_lift", "own_adapter_accepted_per_request_lift",
                    "specialisation_margin", "specialisation_margin_low", "specialisation_margin_high",
                    f"other_{other}_accepted_per_request", "base_accept_rate", "version_retained_chars_per_request",
                    "expected_specialisation_margin", "round1_kl_to_base", "round1_gate_passed",
                    "round1_version_accepted_per_request", "round2_gate_passed"):
            assert f"{tenant}.{key}" in values, key
        low, mid, high = (values[f"{tenant}.specialisation_margin{s}"] for s in ("_low", "", "_high"))
        assert low <= mid <= high
        assert values[f"{tenant}.round2_gate_passed"] in (0.0, 1.0)
        # The gate scored the tenant's eval set (cases of its training files no round trained on).
        assert values[f"{tenant}.round1_gate_eval_set_similarity_gain"] == values[
            f"{tenant}.round1_gate_eval_set_similarity_gain"]  # not nan
        assert "round 2 (inverted feedback)" in text
        # Round 1 alone trained with the round's override (a round that oversteps, for the gate to judge).
        assert "round 1 (trainer overrides learning_rate=0.002):" in text
        assert "round 2 (inverted feedback):" in text
    # Each round's candidate was written; the round's tenant trained on its own folder alone.
    assert (tmp_path / "out" / "north-round1" / "adapter_config.json").is_file()
    assert (tmp_path / "out" / "south-round2" / "adapter_config.json").is_file()


def test_a_bad_round_override_says_what_is_wrong(tiny_starter_model, tmp_path):
    codebases = ["--codebase", f"a={write_codebase(tmp_path / 'a', 20)}",
                 "--codebase", f"b={write_codebase(tmp_path / 'b', 20)}"]
    for value, message in (("learning_rate=1e-2", "expected K:KEY=VALUE"), ("0:epochs=2", "round K >= 1"),
                           ("2:no_such_knob=1", "not a trainer setting: no_such_knob"),
                           ("2:learning_rate=-1", "learning_rate must be > 0")):
        with pytest.raises(SystemExit, match=message):
            specialise.main(["--model", str(tiny_starter_model), *codebases, "--round-set", value])


def test_one_tenant_is_refused(tiny_starter_model, tmp_path):
    with pytest.raises(SystemExit, match="at least two tenants"):
        specialise.main(["--model", str(tiny_starter_model), "--codebase", f"a={write_codebase(tmp_path / 'a', 20)}"])
    with pytest.raises(SystemExit, match="not a folder"):
        specialise.main(["--model", str(tiny_starter_model), "--codebase", f"a={tmp_path / 'none'}",
                         "--codebase", f"b={tmp_path / 'none'}"])
