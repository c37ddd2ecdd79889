"""What a ``block`` developer's outcomes are made of, for a policy serving the demo's block request.

The figures behind docs/learning.md, "Multi-line developers": the tasks of the training packages
(never the eval split), each served once by the base model or an adapter as vLLM samples it
(``benchmarks.policy.run_policy``, the demo's task window and block request by default), decided by
the ``block`` developer, and counted by what decides a block: how many suggestions span several
lines or more lines than the block, end at ``max_tokens``, have the first line right; on a block of
one line, whether a right line stopped there; on a longer block, whether a right first line is
followed by a second line close enough (``BLOCK_MIN_SIMILARITY``); and how many partial accepts
took exactly the first line. Each count is printed with its share and Wilson 95 % interval.

    .venv/bin/python benchmarks/block_outcomes.py --model smollm2 --tasks 200 --seed 11 [--adapter DIR]
"""

from __future__ import annotations

import argparse
import codecs
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.simdev import (  # noqa: E402
    BLOCK_MIN_SIMILARITY,
    REWARDS,
    Request,
    Task,
    edit_similarity,
    load_tasks,
    normalise_line,
    wilson,
)

# The counts, in the order they are printed.
COUNTS = (
    "accepted", "partial", "edited", "rejected", "not_shown",
    "cut_at_max_tokens", "multi_line", "more_lines_than_block", "first_line_right",
    "one_line_blocks", "one_line_right", "one_line_right_went_on",
    "longer_right_with_second_line", "longer_right_second_line_close",
    "partial_took_first_line",
)


def _block_text(lines: Sequence[str]) -> str:
    """Lines as the block developer compares them (``developers.block_accepts``)."""
    return "\n".join([normalise_line(lines[0]), *(normalise_line(row, keep_indent=True) for row in lines[1:])])


def block_outcomes(tasks: Sequence[Task], requests: Sequence[Request]) -> Counter[str]:
    """The counts of ``COUNTS`` over ``requests`` (the ``block`` developer's, one per task)."""
    counts: Counter[str] = Counter({name: 0 for name in COUNTS})
    for task, request in zip(tasks, requests, strict=True):
        counts[request.outcome] += 1
        counts["cut_at_max_tokens"] += request.finish_reason == "length"
        text, truth = request.text.rstrip().split("\n"), task.block.rstrip().split("\n")
        right = bool(request.text.strip()) and normalise_line(text[0]) == normalise_line(truth[0])
        counts["multi_line"] += len(text) > 1
        counts["more_lines_than_block"] += len(text) > len(truth)
        counts["first_line_right"] += right
        if len(truth) == 1:
            counts["one_line_blocks"] += 1
            counts["one_line_right"] += right
            counts["one_line_right_went_on"] += right and len(text) > 1
        elif right and len(text) > 1:
            counts["longer_right_with_second_line"] += 1
            close = edit_similarity(_block_text(text[:2]), _block_text(truth[:2])) >= BLOCK_MIN_SIMILARITY
            counts["longer_right_second_line_close"] += close
        taken = request.accepted_chars or 0
        counts["partial_took_first_line"] += request.outcome == "partial" and request.text[taken : taken + 1] == "\n"
    return counts


def report(counts: Counter[str], requests: Sequence[Request]) -> str:
    n = len(requests)
    lines = [f"{n} requests, reward per request {sum(REWARDS[r.outcome] for r in requests) / max(n, 1):+.4f}"]
    for name in COUNTS:
        estimate = wilson(counts[name], n)
        lines.append(f"{name}: {counts[name]} ({estimate.value:.1%} [{estimate.low:.1%}, {estimate.high:.1%}])")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from demo.loop import CONTEXT, REQUEST

    parser = argparse.ArgumentParser(prog="benchmarks/block_outcomes.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, starter-tiny, starter-small or a model directory")
    parser.add_argument("--adapter", help="serve with this adapter (default: the base model)")
    parser.add_argument("--tasks", type=int, default=200, help="tasks of the training packages")
    parser.add_argument("--seed", type=int, default=11, help="task selection and sampling seed")
    parser.add_argument("--max-tokens", type=int, default=REQUEST["block"]["max_tokens"])
    parser.add_argument("--stop", action="append", type=lambda text: codecs.decode(text, "unicode_escape"),
                        help=f"a stop string (escapes read; repeatable; default {REQUEST['block']['stop']!r})")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)

    import torch

    from benchmarks.policy import resolve_model, run_policy

    torch.set_num_threads(max(1, args.threads))
    tasks = load_tasks("train", args.tasks, seed=args.seed, context=CONTEXT)
    settings = argparse.Namespace(population="block", max_tokens=args.max_tokens, temperature=1.0, pass_tokens=4096,
                                  stop=args.stop if args.stop is not None else list(REQUEST["block"]["stop"]))
    _, requests, _ = run_policy(resolve_model(args.model), Path(args.adapter) if args.adapter else None, tasks,
                                settings, seed=args.seed, label=None)
    print(report(block_outcomes(tasks, requests), requests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
