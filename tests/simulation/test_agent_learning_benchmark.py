"""The agent learning benchmark end to end through its main(), on the tiny starter model and a
handful of tasks (the figures' presence and form; their values are not the point here), and the
simulated user's rule."""

from __future__ import annotations

import re

import pytest

from benchmarks import agent_learning

FIGURE = re.compile(r"^([a-z_]+): (-?\d+(?:\.\d+)?|nan|inf)$")


@pytest.mark.parametrize(
    "answer, fmt, outcome",
    [
        ("```python\nx = 1\n```", "codeblock", "thumbs_up"),
        ("  \n```\nx = 1", "codeblock", "thumbs_up"),
        ("Here is the code:\n```python\nx = 1", "codeblock", "follow_up_dissatisfied"),
        ("Here is how: call it twice.", "nocode", "thumbs_up"),
        ("Sure:\n```python\nx = 1", "nocode", "follow_up_dissatisfied"),
    ],
)
def test_the_simulated_user_judges_the_answers_format(answer, fmt, outcome):
    assert agent_learning.outcome_of(answer, fmt) == outcome


def test_the_conversation_carries_the_tasks_code():
    from benchmarks.simdev import load_tasks

    (task,) = load_tasks("eval", 1)
    (message,) = agent_learning.conversation(task)
    assert message["role"] == "user" and task.prefix[-200:] in message["content"]


def test_main_prints_every_figure(capsys):
    code = agent_learning.main(["--model", "starter-tiny", "--train", "6", "--eval", "6", "--max-tokens", "4",
                                "--format", "nocode"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    found = {m.group(1): float(m.group(2)) for m in map(FIGURE.match, lines) if m}
    for key in ("base_satisfied_rate", "trained_satisfied_rate", "satisfied_rate_lift", "reward_gain",
                "reward_gain_low", "reward_gain_high", "eval_tasks", "train_events"):
        assert key in found, key
    assert found["eval_tasks"] == 6 and 0 <= found["base_satisfied_rate"] <= 1
    assert any(line.startswith("trained: satisfied rate ") for line in lines)
