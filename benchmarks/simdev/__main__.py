"""Write tasks as JSONL, or count what each split holds.

python -m benchmarks.simdev write --split eval --count 500 --population block --out eval.jsonl
python -m benchmarks.simdev count
"""

from __future__ import annotations

import argparse
import collections

from .developers import POPULATIONS
from .tasks import SPLITS, iter_tasks, load_tasks, package_version, write_jsonl


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simdev", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="write COUNT tasks of a split as JSONL")
    write.add_argument("--split", choices=sorted(SPLITS), required=True)
    write.add_argument("--count", type=int, required=True)
    write.add_argument("--seed", type=int, default=0)
    write.add_argument("--population", choices=POPULATIONS, required=True, help="whose middle and suffix to write")
    write.add_argument("--out", required=True)
    commands.add_parser("count", help="tasks available per split and package (reads every file: a minute)")
    args = parser.parse_args(argv)

    if args.command == "write":
        written = write_jsonl(args.out, load_tasks(args.split, args.count, seed=args.seed), args.population)
        print(f"wrote {written} {args.split} tasks for the {args.population} population to {args.out}")
        return
    for split, packages in SPLITS.items():
        counts = collections.Counter(task.package for task in iter_tasks(split))  # type: ignore[arg-type]
        print(f"{split}: {sum(counts.values())} tasks")
        for name in sorted(packages):
            print(f"  {name:<18} {package_version(name):<12} {counts[name]:>7}")


if __name__ == "__main__":
    main()
