"""The learning benchmark end to end through its main(), on the tiny starter model and a handful
of tasks: the printed figures are present and well-formed (their values are not the point here)."""

from __future__ import annotations

import json
import math
import re

import pytest

from benchmarks import learning, policy
from benchmarks.sampling import cut_completion
from benchmarks.simdev import load_tasks

FIGURE = re.compile(r"^([a-z0-9_]+): (-?\d+(?:\.\d+)?|nan|inf)$")
ESTIMATE = r"(?:n/a \(n=\d+\)|-?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\] \(n=\d+\))"
PER_MODEL = ("accept_rate", "shown_per_request", "accepted_per_request", "mean_reward")
SAMPLED_ONLY = ("retained_chars_per_request", "retained_share")  # not among the expected (computed) figures


def figures(text: str) -> dict[str, float]:
    """The ``name: value`` lines after the last blank line, each required to be well-formed."""
    tail = text.rstrip("\n").rsplit("\n\n", 1)[1].splitlines()
    out = {}
    for line in tail:
        match = FIGURE.match(line)
        assert match, f"malformed figure line {line!r}"
        out[match.group(1)] = float(match.group(2))
    return out


def model_blocks(text: str) -> dict[str, int]:
    """Model name -> its number of tasks, each block holding the four figures with intervals."""
    blocks = re.findall(
        rf"^(\w+): (\d+) tasks, \d+ shown, \d+ accepted, \d+ taken in part, \d+ fixed\n"
        rf"  accept rate of shown  {ESTIMATE}\n"
        rf"  shown per request     {ESTIMATE}\n"
        rf"  accepted per request  {ESTIMATE}\n"
        rf"  mean reward           {ESTIMATE}$",
        text,
        flags=re.M,
    )
    return {name: int(n) for name, n in blocks}


@pytest.fixture(scope="module")
def trained_run(tiny_starter_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("learning")
    return out, [
        "--model", str(tiny_starter_model), "--population", "line", "--train-tasks", "3", "--eval-tasks", "4",
        "--rounds", "2", "--seed", "1", "--set", "epochs=1", "--set", "num_minibatches=1", "--max-tokens", "6",
        "--out", str(out),
    ]


def test_trains_both_variants_and_prints_every_figure(trained_run, capsys):
    out, argv = trained_run
    assert learning.main(argv) == 0
    text = capsys.readouterr().out
    assert model_blocks(text) == {"base": 4, "trained": 4, "raw": 4}
    values = figures(text)
    expected = {"eval_tasks", "train_events", "accept_rate_lift", "accepted_per_request_lift", "reward_gain",
                "raw_accept_rate_lift", "raw_accepted_per_request_lift", "raw_reward_gain"}
    expected |= {f"{model}_{figure}" for model in ("base", "trained", "raw") for figure in PER_MODEL + SAMPLED_ONLY}
    # The line developer's expected outcomes: per model, and each trained model's lifts and paired gain.
    expected |= {f"expected_{model}_{figure}" for model in ("base", "trained", "raw") for figure in PER_MODEL}
    gains = ("accept_rate_lift", "accepted_per_request_lift", "accepted_per_request_gain",
             "accepted_per_request_gain_low", "accepted_per_request_gain_high")
    expected |= {f"{prefix}expected_{gain}" for prefix in ("", "raw_") for gain in gains}
    assert set(values) == expected
    assert values["eval_tasks"] == 4 and values["train_events"] == 6
    for model in ("base", "trained", "raw"):
        assert 0 <= values[f"{model}_shown_per_request"] <= 1
        assert -0.25 <= values[f"{model}_mean_reward"] <= 0.75
    assert math.isclose(values["reward_gain"], values["trained_mean_reward"] - values["base_mean_reward"],
                        abs_tol=2e-4)
    for model in ("base", "trained", "raw"):
        accepted = values[f"expected_{model}_accepted_per_request"]
        shown = values[f"expected_{model}_shown_per_request"]
        assert 0 <= accepted <= shown <= 1
    assert values["expected_accepted_per_request_gain_low"] <= values["expected_accepted_per_request_gain"]
    assert values["expected_accepted_per_request_gain"] <= values["expected_accepted_per_request_gain_high"]
    # Two rounds, the defaults continuing their own adapter, the raw variant (the comparison) trained on
    # round 1's events only; the events are in the trainer's format.
    assert (out / "trained-round2" / "adapter_config.json").is_file() and not (out / "raw-round2").exists()
    for name in ("trained", "raw"):
        events = [json.loads(line) for line in (out / f"events-{name}-round1.jsonl").read_text().splitlines()]
        assert len(events) == 3
        for event in events:
            assert event["reward"] in (0.75, -0.25, 0.0, 0.25)
            assert len(event["behaviour_logprobs"]) == len(event["completion_token_ids"]) <= 6
            assert (event.get("token_rewards") is not None) == (event["reward"] == 0.25)
    # Round 1 trains both variants on the same events.
    assert (out / "events-trained-round1.jsonl").read_text() == (out / "events-raw-round1.jsonl").read_text()


def test_evaluates_an_existing_adapter_on_a_task_file(trained_run, tiny_starter_model, tmp_path, capsys):
    out, _ = trained_run
    adapter = out / "trained-round2"
    if not adapter.is_dir():  # this test run alone
        learning.main(trained_run[1])
        capsys.readouterr()
    tasks = tmp_path / "tasks.jsonl"
    records = [{"prefix": t.prefix, "suffix": t.suffix, "middle": t.line_rest} for t in load_tasks("eval", 3, seed=2)]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in records))
    argv = ["--model", str(tiny_starter_model), "--adapter", str(adapter), "--tasks", str(tasks), "--max-tokens", "6",
            "--stop", "\\n"]
    assert learning.main(argv) == 0
    text = capsys.readouterr().out
    assert model_blocks(text) == {"base": 3, "adapter": 3}
    values = figures(text)
    assert values["eval_tasks"] == 3 and values["train_events"] == 0
    assert {"accept_rate_lift", "accepted_per_request_lift", "reward_gain", "adapter_accept_rate"} <= set(values)
    assert not any(key.startswith("raw_") for key in values)


def test_a_stop_string_ends_the_text_and_keeps_the_token_that_completed_it(tiny_starter_model):
    from gpu_trainer.model_loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_starter_model)
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode("x = 1\ny = 2", add_special_tokens=False)
    tokens, text, stopped = cut_completion(tokenizer, ids + [eos], eos, ["\n"])
    assert text == "x = 1" and stopped and "\n" in tokenizer.decode(tokens) and eos not in tokens
    assert tokenizer.decode(tokens[:-1]) == "x = 1"[: len(tokenizer.decode(tokens[:-1]))]
    # No stop string: the text runs to EOS, which ends the token ids.
    tokens, text, stopped = cut_completion(tokenizer, ids + [eos, eos], eos, [])
    assert text == "x = 1\ny = 2" and stopped and tokens == ids + [eos]
    # Neither: cut by length, nothing added.
    assert cut_completion(tokenizer, ids, eos, []) == (ids, "x = 1\ny = 2", False)
    # A newline first is an empty suggestion: nothing to show.
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert cut_completion(tokenizer, newline + ids, eos, ["\n"])[1] == ""


def test_bad_arguments_exit_with_a_message(tiny_starter_model, tmp_path):
    with pytest.raises(SystemExit, match="--adapter"):
        learning.main(["--model", str(tiny_starter_model), "--adapter", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="unknown field"):
        learning.main(["--model", str(tiny_starter_model), "--set", "no_such_field=1"])


def test_expected_outcomes_match_what_sampling_finds(tiny_starter_model):
    """The computed P(accepted) of a task equals the rate at which sampling produces its rest of the
    line (in the same tokens) and then a line break; the computed P(silent) the rate of suggestions
    that are empty. Checked against 2,000 real samples of one prompt, within four standard errors."""
    import collections

    import torch

    from benchmarks.expected import ending_token_ids, expected_outcomes
    from benchmarks.sampling import sample_suggestions
    from benchmarks.simdev import Task

    model, tokenizer = policy.load_model(tiny_starter_model, None)
    torch.set_num_threads(1)
    prompt = "class Foo:\n    def __init__(self"
    n = 2000
    served = sample_suggestions(model, tokenizer, [prompt] * n, max_new_tokens=6, temperature=1.0, seed=3,
                                pass_tokens=16384, progress=None, stop=["\n"])
    ending = set(ending_token_ids(tokenizer, line_stop=True))
    ended = [tuple(s.completion_token_ids[:-1]) for s in served
             if s.completion_token_ids and s.completion_token_ids[-1] in ending and len(s.completion_token_ids) > 1]
    rest_ids, count = collections.Counter(ended).most_common(1)[0]
    rest = tokenizer.decode(list(rest_ids))
    assert tokenizer.encode(rest, add_special_tokens=False) == list(rest_ids)
    task = Task(id="t", split="file", package="", path="", line=2, column=len("    def __init__(self"), prefix=prompt,
                line_rest=rest, block=rest, suffix="", block_suffix="")
    outcome = expected_outcomes(model, tokenizer, [prompt], [task], line_stop=True, pass_tokens=4096)

    def close(computed: float, sampled: float) -> bool:
        return abs(computed - sampled) <= 4 * (max(sampled, 1 / n) * (1 - sampled) / n) ** 0.5

    sampled_accept = count / n
    sampled_silent = sum(not s.text for s in served) / n
    assert sampled_accept >= 0.005  # the check has something to compare
    assert close(outcome.accept[0], sampled_accept), (rest, outcome.accept, sampled_accept)
    assert close(outcome.silent[0], sampled_silent), (outcome.silent, sampled_silent)


def test_each_round_is_evaluated_with_its_own_figures(tiny_starter_model, capsys):
    argv = ["--model", str(tiny_starter_model), "--train-tasks", "3", "--eval-tasks", "4", "--rounds", "2",
            "--eval-each-round", "--seed", "2", "--set", "epochs=1", "--set", "num_minibatches=1",
            "--max-tokens", "6"]
    assert learning.main(argv) == 0
    text = capsys.readouterr().out
    assert "after round 1:" in text and "after round 2:" in text
    lines = dict(line.split(": ", 1) for line in text.splitlines() if FIGURE.match(line))
    assert lines["round1_train_events"] == "3" and lines["train_events"] == "6"
    after_one, after_two = text.split("after round 1:")[1].split("after round 2:")
    # The raw variant, the comparison, trains on round 1's events and is judged after it.
    assert model_blocks(after_one) == {"base": 4, "trained": 4, "raw": 4}
    assert model_blocks(after_two) == {"base": 4, "trained": 4}
    assert {"round1_accepted_per_request_lift", "accepted_per_request_lift"} <= set(lines)


def test_a_partial_accept_and_an_edit_train_with_the_exporters_token_credit(tiny_starter_model):
    """The benchmark's samples carry the credit the exporter gives the same feedback
    (``learning_shared.credit.token_rewards``): the taken tokens +0.75, the first untaken −0.25; an
    edit also its kept text as tokens (``preferred_token_ids``)."""
    from benchmarks.sampling import Served
    from benchmarks.simdev import Request, respond
    from gpu_trainer.model_loading import load_tokenizer
    from learning_shared.credit import token_rewards

    tokenizer = load_tokenizer(tiny_starter_model)
    meant = "total = compute(items, rate)"
    task = load_tasks("train", 1, seed=0)[0].__class__(
        id="t", split="train", package="p", path="p/m.py", line=1, column=0, prefix="x = 1\n", line_rest=meant,
        block=meant, suffix="", block_suffix="",
    )  # fmt: skip
    samples = []
    for text in ("total = compute(other)", "total = compute(items, rat)", "nothing like it"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        served = Served(prompt_token_ids=[1, 2], completion_token_ids=ids, logprobs=[-1.0] * len(ids), text=text,
                        finish_reason="stop")
        request = Request.decided(respond("line", text, task), index=0, task_id="t", interaction_id="", version="v",
                                  user="", text=text, finish_reason="stop", latency_s=0.0)
        samples.append((request, policy.to_samples([served], [request], tokenizer)[0], ids))
    (partial, first, ids_p), (edited, second, ids_e), (rejected, third, _) = samples
    assert partial.outcome == "partial" and partial.accepted_chars == len("total = compute(")
    assert first.reward == 0.25
    assert list(first.token_rewards) == token_rewards(ids_p, "total = compute(", tokenizer=tokenizer, kept_reward=0.75,
                                                      rejected_reward=-0.25)
    assert first.token_rewards.count(-0.25) == 1 and first.token_rewards[0] == 0.75
    assert edited.outcome == "edited" and edited.kept_text == meant
    assert second.token_rewards[0] == 0.75 and -0.25 in second.token_rewards
    assert rejected.outcome == "rejected" and third.token_rewards is None and third.reward == -0.25
    # An edit's kept text is its preferred continuation, as the exporter gives it; nothing else has one.
    assert list(second.preferred_token_ids) == tokenizer.encode(meant, add_special_tokens=False)
    assert first.preferred_token_ids is None and third.preferred_token_ids is None


def test_a_withheld_suggestion_leaves_nothing_shown_taken_or_kept():
    from benchmarks.sampling import Served
    from benchmarks.simdev import Request, respond

    task = load_tasks("train", 1, seed=0)[0]
    typed = task.line_rest[: max(1, len(task.line_rest) // 2)]  # a right start: taken in part, kept
    request = Request.decided(respond("line", typed + " ???", task), index=0, task_id=task.id, interaction_id="",
                              version="v", user="", text=typed + " ???", finish_reason="stop", latency_s=0.0)
    assert request.retained_chars > 0
    served = Served([1, 2], [3, 4], [-5.0, -5.0], request.text, "stop")
    kept, = policy.gated([request], [served], threshold=-1.0, population="line", tasks=[task])
    assert (kept.outcome, kept.text, kept.accepted_chars, kept.accepted_text_chars, kept.retained_chars) == (
        "not_shown", "", None, 0, 0)
    shown, = policy.gated([request], [served], threshold=-20.0, population="line", tasks=[task])
    assert shown == request
