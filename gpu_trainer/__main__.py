"""Command line: ``python -m gpu_trainer {train,score} ...`` (base models: ``python -m model_supply``).

Each command imports what it runs inside its handler: the CLI starts (and ``--help`` answers)
without importing torch, and only a command that needs it loads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from learning_shared.errors import TrainerInputError


def _parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values are JSON when they parse (numbers, lists, null), else strings."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise TrainerInputError(f"--set expects key=value, got {pair!r}")
        try:
            overrides[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key.strip()] = raw
    return overrides


def _cmd_train(args: argparse.Namespace) -> int:
    from gpu_trainer.config import GRPOConfig, PPOConfig

    data: dict[str, Any] = json.loads(Path(args.config).read_text()) if args.config else {}
    data.update(_parse_overrides(args.set))
    if args.seed is not None:
        data["seed"] = args.seed
    if args.mode == "grpo":
        from gpu_trainer.grpo import train_grpo
        from gpu_trainer.scoring import read_records

        grpo_config = GRPOConfig.from_dict(data)
        result = train_grpo(grpo_config, read_records(args.data), base_model_dir=args.base, out_dir=args.out,
                            parent_adapter_dir=args.parent, progress=not args.no_progress)
    else:
        from gpu_trainer.ppo import train_ppo
        from learning_shared.samples import load_samples

        ppo_config = PPOConfig.from_dict(data)
        result = train_ppo(ppo_config, load_samples(args.data), base_model_dir=args.base, out_dir=args.out,
                           parent_adapter_dir=args.parent, progress=not args.no_progress)
    print(json.dumps({"out_dir": str(result.out_dir), "steps": result.steps, **result.summary}, indent=2))
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from gpu_trainer.scoring import read_records, score_dataset

    result = score_dataset(read_records(args.data), base_model_dir=args.base, adapter_dir=args.adapter,
                           family=args.family, max_new_tokens=args.max_new_tokens, device=args.device)
    print(json.dumps(result, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from learning_shared.fim import FAMILIES

    parser = argparse.ArgumentParser(prog="python -m gpu_trainer",
                                     description="Strop's trainer: critic-free PPO on LoRA, scoring.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a LoRA adapter from a JSONL of samples; prints a JSON summary")
    train.add_argument("--data", required=True, help="JSONL: PPO samples, or FIM cases (prefix/suffix/middle) for grpo")
    train.add_argument("--mode", choices=("ppo", "grpo"), default="ppo")
    train.add_argument("--base", required=True, help="base model directory (HF format)")
    train.add_argument("--parent", help="parent adapter directory to continue (default: a fresh LoRA)")
    train.add_argument("--out", required=True, help="new adapter directory (must not exist)")
    train.add_argument("--config", help="JSON file of config fields")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one config field, e.g. --set learning_rate=5e-4 (repeatable)")
    train.add_argument("--seed", type=int)
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=_cmd_train)

    score = sub.add_parser("score", help="score a dataset with the base model or an adapter; prints JSON")
    score.add_argument("--data", required=True, help="JSONL of PPO samples and/or FIM cases (prefix/suffix/middle)")
    score.add_argument("--base", required=True)
    score.add_argument("--adapter", help="adapter directory (default: the base model alone)")
    score.add_argument("--family", choices=FAMILIES, help="FIM family (default: detected from the tokenizer)")
    score.add_argument("--max-new-tokens", type=int, default=64)
    score.add_argument("--device", default="auto")
    score.set_defaults(func=_cmd_score)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (TrainerInputError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
