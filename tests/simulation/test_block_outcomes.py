"""The block developers' outcome breakdown (benchmarks/block_outcomes.py): what each count counts."""

from __future__ import annotations

import re

from benchmarks import block_outcomes
from benchmarks.simdev import Request, respond
from benchmarks.simdev.tasks import Task

ONE_LINE = "x = compute(a, b)"
LONGER = "self._lock = threading.Lock()\n        self._items = []\n        self._closed = False"


def task(block: str) -> Task:
    return Task(
        id="t", split="train", package="p", path="p/m.py", line=1, column=1, prefix="    ",
        line_rest=block.split("\n")[0], block=block, suffix="", block_suffix="",
    )  # fmt: skip


def served(t: Task, text: str, finish_reason: str = "stop") -> Request:
    return Request.decided(respond("block", text, t), index=0, task_id=t.id, interaction_id="", version="",
                           user="", text=text, finish_reason=finish_reason, latency_s=0.0)


def test_each_count_says_what_decided_the_block():
    cases = [
        (task(ONE_LINE), ONE_LINE),  # a right line that ends its block, stopped: accepted
        (task(ONE_LINE), ONE_LINE + "\n    return x"),  # the same line gone on: taken up to the line's end
        (task(LONGER), "self._lock = threading.Lock()\n        self._items = []"),  # two right lines: accepted
        (task(LONGER), "self._lock = threading.Lock()\n        del self._other_thing"),  # second line far off
        (task(LONGER), "self._lock = None\n        self._items = []\n        self._closed = False\n        x = 1"),
        (task(LONGER), ""),
    ]
    tasks = [t for t, _ in cases]
    requests = [served(t, text, "length" if k == 4 else "stop") for k, (t, text) in enumerate(cases)]
    assert [r.outcome for r in requests] == ["accepted", "partial", "accepted", "partial", "partial", "not_shown"]

    counts = block_outcomes.block_outcomes(tasks, requests)

    assert (counts["accepted"], counts["partial"], counts["not_shown"], counts["rejected"]) == (2, 3, 1, 0)
    assert counts["cut_at_max_tokens"] == 1
    assert counts["multi_line"] == 4 and counts["more_lines_than_block"] == 2
    assert counts["first_line_right"] == 4  # not the wrong first line, not the empty suggestion
    assert (counts["one_line_blocks"], counts["one_line_right"], counts["one_line_right_went_on"]) == (2, 2, 1)
    assert counts["longer_right_with_second_line"] == 2 and counts["longer_right_second_line_close"] == 1
    # Taken exactly up to the end of the first line: the line gone on, and the far-off second line.
    assert counts["partial_took_first_line"] == 2


def test_the_report_prints_every_count_with_its_share_and_interval():
    t = task(ONE_LINE)
    requests = [served(t, ONE_LINE), served(t, "y = 2")]
    text = block_outcomes.report(block_outcomes.block_outcomes([t, t], requests), requests)
    assert text.splitlines()[0] == "2 requests, reward per request +0.2500"
    rows = dict(re.findall(r"^(\w+): (\d+ \(\d+\.\d%) \[\d+\.\d%, \d+\.\d%\]\)$", text, flags=re.MULTILINE))
    assert list(rows) == list(block_outcomes.COUNTS)
    assert rows["accepted"] == "1 (50.0%" and rows["rejected"] == "1 (50.0%"


def test_main_serves_the_training_tasks_with_the_block_request(tiny_starter_model, capsys):
    assert block_outcomes.main(["--model", str(tiny_starter_model), "--tasks", "3", "--max-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 requests, reward per request ")
    assert sum(int(re.search(rf"^{name}: (\d+)", out, re.MULTILINE).group(1))
               for name in ("accepted", "partial", "edited", "rejected", "not_shown")) == 3
