"""Agent learning benchmark: does PPO on an agent's users' feedback make a real chat model answer
the way its users want, on code it never trained on?

The task: a user pastes real code (the simulated developers' tasks: files of the training
packages to learn from, of the evaluation packages to measure) and asks the agent to continue it.
The simulated user is satisfied only by answers in one format (``--format``):

- ``codeblock``: the answer opens with a fenced code block (```` ``` ````), the code first;
- ``nocode``: the answer holds no fenced code block.

A satisfied user gives ``thumbs_up`` (reward +1.0 in the default policy), any other answer gets a
dissatisfied follow-up (``follow_up_dissatisfied``, −0.5). The conversation is rendered with the
model's chat template as Strop renders it (``learning_shared.chat``), answers are sampled as serving
samples them (temperature 1, at most ``--max-tokens`` tokens: the user judges the opening), and
each becomes one training sample as the exporter builds it.

1. Collect ``--train`` answers of the policy (the base model first) and their rewards.
2. Train an adapter with ``gpu_trainer.ppo.train_ppo`` (the trainer's defaults, ``--set`` to
   override); ``--rounds`` > 1 repeats collect-then-train with the adapter's own answers.
3. Evaluate the base model and the adapter on ``--eval`` tasks of the evaluation packages with the
   same user and the same sampling seeds.

Output: per model the satisfied rate (Wilson 95 % interval) and the mean reward (normal 95 %
interval), then ``name: value`` lines: ``base_satisfied_rate``, ``trained_satisfied_rate``,
``satisfied_rate_lift`` (relative), ``reward_gain`` (difference of mean rewards) and its paired
95 % interval over the same tasks.

    python benchmarks/agent_learning.py [--model smollm2|starter-tiny|DIR] [--format codeblock|nocode]
        [--train 192] [--eval 160] [--rounds 1] [--max-tokens 24] [--seed 0] [--threads 1] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.policy import format_value, load_model, parse_overrides, relative_lift, resolve_model, train  # noqa: E402
from benchmarks.sampling import Served, sample_suggestions  # noqa: E402
from benchmarks.simdev import Context, Task, load_tasks  # noqa: E402
from benchmarks.simdev.stats import Estimate, mean_interval, wilson  # noqa: E402
from learning_shared.samples import Sample  # noqa: E402

# The default training policy's rewards of the two signals this user gives (TrainingPolicy).
REWARDS = {"thumbs_up": 1.0, "follow_up_dissatisfied": -0.5}
FORMATS = ("codeblock", "nocode")
CODE_CHARS = 600  # the code the user pastes: the end of the task's prefix


def conversation(task: Task) -> list[dict[str, str]]:
    code = task.prefix[-CODE_CHARS:]
    return [{"role": "user", "content": f"Continue this Python code:\n```python\n{code}\n```"}]


def satisfied(answer: str, fmt: str) -> bool:
    """The simulated user's verdict on an answer's opening."""
    if fmt == "codeblock":
        return answer.lstrip().startswith("```")
    return "```" not in answer


def outcome_of(answer: str, fmt: str) -> str:
    return "thumbs_up" if satisfied(answer, fmt) else "follow_up_dissatisfied"


def run_policy(model_dir: Path, adapter: Path | None, tasks: Sequence[Task], args: argparse.Namespace, *,
               seed: int, label: str) -> tuple[list[Served], list[str]]:
    from learning_shared.chat import chat_prompt_text

    model, tokenizer = load_model(model_dir, adapter)
    prompts = [chat_prompt_text(tokenizer, model_dir, conversation(task)) for task in tasks]
    served = sample_suggestions(model, tokenizer, prompts, max_new_tokens=args.max_tokens, temperature=1.0, seed=seed,
                                pass_tokens=args.pass_tokens, progress=label)
    del model
    return served, [outcome_of(s.text, args.format) for s in served]


def to_samples(served: Sequence[Served], outcomes: Sequence[str]) -> list[Sample]:
    """The trainer's samples, as the exporter builds a served chat turn's."""
    return [
        Sample.build(
            id=str(i),
            prompt_token_ids=s.prompt_token_ids,
            completion_token_ids=s.completion_token_ids,
            behaviour_logprobs=s.logprobs,
            reward=REWARDS[o],
            silent=not s.text.strip(),
            # An empty answer leaves the user to ask again, as the exporter says of an agent's turn.
            silence_reward=REWARDS["follow_up_dissatisfied"],
        )
        for i, (s, o) in enumerate(zip(served, outcomes, strict=True))
    ]


def summary(outcomes: Sequence[str]) -> tuple[Estimate, Estimate]:
    rate = wilson(sum(o == "thumbs_up" for o in outcomes), len(outcomes))
    return rate, mean_interval([REWARDS[o] for o in outcomes])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/agent_learning.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (default), starter-tiny or a model directory")
    parser.add_argument("--format", choices=FORMATS, default="codeblock", help="the answers the user wants")
    parser.add_argument("--train", type=int, default=192, help="answers collected per round")
    parser.add_argument("--eval", type=int, default=160, help="held-out tasks (evaluation packages)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per answer (the user judges the opening)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--pass-tokens", type=int, default=8192, help="tokens per sampling pass")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a PPOConfig override")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from gpu_trainer.config import PPOConfig
    from learning_shared.errors import TrainerInputError

    torch.set_num_threads(max(1, args.threads))
    for name in ("train", "eval", "rounds", "max_tokens"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1")
    try:
        overrides = parse_overrides(args.set)
        config = PPOConfig.from_dict({"seed": args.seed, "device": "cpu", "dtype": "float32", **overrides})
    except TrainerInputError as exc:
        raise SystemExit(f"error: {exc}") from None
    model_dir = resolve_model(args.model)
    context = Context()
    started = time.monotonic()
    train_tasks = load_tasks("train", args.train * args.rounds, seed=args.seed, context=context)
    eval_tasks = load_tasks("eval", args.eval, seed=args.seed, context=context)
    print(f"model {model_dir.name}, user wants {args.format}, {len(eval_tasks)} eval tasks (evaluation packages), "
          f"{args.train} train answers x {args.rounds} round(s), {args.max_tokens} tokens per answer, "
          f"seed {args.seed}", flush=True)
    if overrides:
        print(f"trainer overrides: {json.dumps(overrides)}", flush=True)

    adapter: Path | None = None
    with tempfile.TemporaryDirectory(prefix="strop-agent-bench-") as work:
        for round_index in range(args.rounds):
            tasks = train_tasks[round_index * args.train:(round_index + 1) * args.train]
            label = f"collect r{round_index + 1}"
            served, outcomes = run_policy(model_dir, adapter, tasks, args, seed=args.seed + 1000 * round_index,
                                          label=label)
            rate, _ = summary(outcomes)
            print(f"[{label}] satisfied {rate}", file=sys.stderr, flush=True)
            adapter = train(model_dir, to_samples(served, outcomes), config.replace(seed=args.seed + round_index),
                            Path(work) / f"r{round_index}", adapter, f"train r{round_index + 1}")
        results: dict[str, list[str]] = {}
        for name, policy in (("base", None), ("trained", adapter)):
            _, results[name] = run_policy(model_dir, policy, eval_tasks, args, seed=args.seed + 7, label=f"eval {name}")

    figures: dict[str, float] = {"eval_tasks": len(eval_tasks), "train_events": args.train * args.rounds}
    for name, outcomes in results.items():
        rate, reward = summary(outcomes)
        print(f"{name}: satisfied rate {rate}, mean reward {reward}")
        figures[f"{name}_satisfied_rate"] = rate.value
        figures[f"{name}_mean_reward"] = reward.value
    figures["satisfied_rate_lift"] = relative_lift(figures["trained_satisfied_rate"], figures["base_satisfied_rate"])
    paired = mean_interval([REWARDS[t] - REWARDS[b] for t, b in zip(results["trained"], results["base"], strict=True)])
    figures["reward_gain"] = paired.value
    figures["reward_gain_low"], figures["reward_gain_high"] = paired.low, paired.high
    figures["wall_seconds"] = round(time.monotonic() - started, 1)
    for key, value in figures.items():
        print(f"{key}: {format_value(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
