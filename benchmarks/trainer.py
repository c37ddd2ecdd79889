"""Trainer throughput and memory: the full PPO update versus a bare forward+backward+optimizer step.

Same model, same fresh LoRA, same samples, same minibatches cut into the same passes by the
token budget (``max_tokens_per_pass``), in the same order. The PPO side is
``policy_update.run_policy_update`` exactly as training runs it: old log-probs recomputed under no_grad,
the KL-to-base reference (free for a fresh LoRA: it equals the base), the clipped loss with
importance weights, entropy and all per-step metrics. The bare side is the ceiling: log-probs of
the same completion tokens, ``-mean`` as the loss, backward, AdamW step. ``target_kl`` is off so
both sides take the same number of steps. Figures are trained tokens (prompt + completion, no
padding) per second of wall time and of the process's CPU time, and the peak resident memory
(ru_maxrss) of the process doing the work.

Every measured run is a fresh subprocess, so peaks do not mix and each starts cold alike;
runs alternate between the sides (the machine is shared: the best run of each side estimates
its uncontended speed, and the paired ratios show the spread).

Samples are synthetic but made of real code: the model's tokenizer encodes Python standard
library modules into one stream of ids; each prompt is a window of that stream whose length is
drawn log-uniformly from [32, --max-prompt-tokens] (the first sample always has the maximum), and
its completion is the next 0-32 tokens of the stream (0: silence), with random serving
log-probs and rewards (+0.75 / −0.25, silence 0).

    python benchmarks/trainer.py [--model starter|smollm2 | --base DIR] [--samples 512]
        [--max-prompt-tokens 1024] [--repeats 2] [--threads 2] [--side both|ppo|bare]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STDLIB_MODULES = ("argparse.py", "typing.py", "dataclasses.py", "pathlib.py", "inspect.py", "textwrap.py")


def synthetic_samples(tokenizer, n: int, *, max_prompt_tokens: int, seed: int) -> list:
    import sysconfig

    from learning_shared.samples import Sample

    rng = random.Random(seed)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    stream = [
        t for name in STDLIB_MODULES for t in tokenizer.encode((stdlib / name).read_text(), add_special_tokens=False)
    ]
    samples = []
    for index in range(n):
        length = (
            max_prompt_tokens if index == 0 else round(math.exp(rng.uniform(math.log(32), math.log(max_prompt_tokens))))
        )
        start = rng.randrange(0, len(stream) - length - 40)
        completion_len = rng.choice([0, 1, 4, 8, 16, 24, 32])
        completion = stream[start + length : start + length + completion_len]
        behaviour = [-rng.uniform(0.01, 3.0) for _ in completion] or None
        reward = 0.0 if not completion else rng.choice([0.75, -0.25, -0.25])
        samples.append(
            Sample(
                tuple(stream[start : start + length]),
                tuple(completion),
                tuple(behaviour) if behaviour else None,
                reward,
            )
        )
    return samples


def bare_steps(policy, samples: list, config) -> int:
    """The ceiling: the same minibatches, passes and order as run_policy_update, nothing but the step."""
    import torch

    from gpu_trainer.batching import completion_tokens, make_batch, plan_micro_batches, sequence_length
    from gpu_trainer.logprobs import completion_logprobs
    from gpu_trainer.memory import release_freed_memory

    model = policy.model
    generator = torch.Generator().manual_seed(config.seed)
    num_minibatches = min(config.num_minibatches, len(samples))
    order = torch.randperm(len(samples), generator=generator)
    epoch_orders = [torch.randperm(num_minibatches, generator=generator).tolist() for _ in range(config.epochs)]
    lengths = [sequence_length(s, eos_id=policy.eos_id, max_prompt_tokens=config.max_prompt_tokens) for s in samples]
    parts = [p.tolist() for p in order.tensor_split(num_minibatches)]
    plans = [plan_micro_batches(lengths, part, max_tokens=config.max_tokens_per_pass) for part in parts]
    counts = [sum(len(completion_tokens(samples[i], policy.eos_id)) for i in part) for part in parts]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    model.train()
    tokens = 0
    for epoch in range(config.epochs):
        for mb in epoch_orders[epoch]:
            optimizer.zero_grad(set_to_none=True)
            for rows in plans[mb]:
                batch = make_batch(
                    [samples[i] for i in rows],
                    eos_id=policy.eos_id,
                    pad_id=policy.pad_id,
                    max_prompt_tokens=config.max_prompt_tokens,
                    device=policy.device,
                )
                logprobs, _ = completion_logprobs(model, batch)
                (-(logprobs * batch.mask).sum() / counts[mb]).backward()
                tokens += batch.num_tokens
                release_freed_memory()  # as the trainer does after each pass
            optimizer.step()
    return tokens


def ppo_update(policy, samples: list, config) -> int:
    import torch

    from gpu_trainer.losses import compute_advantages
    from gpu_trainer.policy_update import run_policy_update

    rewards = torch.tensor([s.reward for s in samples])
    advantages = compute_advantages(rewards, baseline=config.baseline, normalize=config.normalize_advantages)
    metrics, _ = run_policy_update(policy, samples, advantages, config, progress=False)
    return sum(m["tokens"] for m in metrics)


def worker(args: argparse.Namespace) -> int:
    """One measured run in this (fresh) process; prints one JSON line."""
    import torch

    from gpu_trainer.config import PPOConfig
    from gpu_trainer.model_loading import load_policy

    torch.set_num_threads(args.threads)
    config = PPOConfig(
        target_kl=None,
        device="cpu",
        max_prompt_tokens=args.max_prompt_tokens,
        max_tokens_per_pass=args.budget,
        gradient_checkpointing=args.checkpointing,
    )
    policy = load_policy(config, base_model_dir=args.base, parent_adapter_dir=None)
    samples = synthetic_samples(policy.tokenizer, args.samples, max_prompt_tokens=args.max_prompt_tokens, seed=0)
    loaded_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started, cpu_started = time.perf_counter(), time.process_time()
    tokens = (ppo_update if args.worker == "ppo" else bare_steps)(policy, samples, config)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    print(
        json.dumps(
            {
                "side": args.worker,
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds,
                "tokens_per_cpu_s": tokens / cpu_seconds,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "loaded_rss_mb": loaded_mb,
                "samples": len(samples),
                "prompt_tokens": sum(len(s.prompt_token_ids) for s in samples),
            }
        )
    )
    return 0


def resolve_base(args: argparse.Namespace) -> Path:
    if args.base:
        return Path(args.base)
    if args.model == "smollm2":
        from model_supply.base_models import ensure_smollm2

        return ensure_smollm2(progress=sys.stderr.isatty())
    from model_supply.starter import ensure_starter_model

    return ensure_starter_model("small", progress=sys.stderr.isatty())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default="starter",
        choices=("starter", "smollm2"),
        help="the small starter model, or SmolLM2-135M-Instruct (built from its wheel if needed)",
    )
    parser.add_argument("--base", help="any HF causal LM directory instead")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=1024, help="max_tokens_per_pass")
    parser.add_argument("--checkpointing", action="store_true", help="gradient_checkpointing on")
    parser.add_argument("--repeats", type=int, default=2, help="measured runs per side, alternating")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--side", default="both", choices=("both", "ppo", "bare"))
    parser.add_argument("--worker", choices=("ppo", "bare"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    base = resolve_base(args)
    sides = ("bare", "ppo") if args.side == "both" else (args.side,)
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for repeat in range(args.repeats):
        for side in sides:
            command = [
                sys.executable,
                __file__,
                "--worker",
                side,
                "--base",
                str(base),
                "--samples",
                str(args.samples),
                "--max-prompt-tokens",
                str(args.max_prompt_tokens),
                "--budget",
                str(args.budget),
                "--threads",
                str(args.threads),
            ] + (["--checkpointing"] if args.checkpointing else [])
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs[side].append(run)
            print(
                f"  run {repeat + 1} {side:4s}: {run['tokens_per_s']:8,.1f} tokens/s  "
                f"{run['tokens_per_cpu_s']:8,.1f} tokens/CPU-s  peak {run['peak_rss_mb']:6,.0f} MB  "
                f"({run['seconds']:.0f} s)",
                flush=True,
            )
    first = next(iter(runs.values()))[0]
    print(
        f"model: {base.name} | cpu fp32 | threads: {args.threads} | samples: {first['samples']} "
        f"({first['prompt_tokens']:,} prompt tokens, prompts 32-{args.max_prompt_tokens}) | max_tokens_per_pass: "
        f"{args.budget} | gradient_checkpointing: {args.checkpointing} | runs per side: {args.repeats}"
    )
    for side, label in (("bare", "bare forward+backward+step"), ("ppo", "ppo update (full)")):
        if side in runs:
            speeds = [r["tokens_per_s"] for r in runs[side]]
            cpu_speeds = [r["tokens_per_cpu_s"] for r in runs[side]]
            peaks = [r["peak_rss_mb"] for r in runs[side]]
            print(
                f"{label:27s}: {min(speeds):,.1f}-{max(speeds):,.1f} tokens/s, {min(cpu_speeds):,.1f}-"
                f"{max(cpu_speeds):,.1f} tokens/CPU-s | peak resident {min(peaks):,.0f}-{max(peaks):,.0f} MB"
            )
    if len(sides) == 2:
        # CPU seconds are the steadier measure on a shared machine: another process's load
        # stretches wall time but not (much) the work this process does.
        for key, unit in (("tokens_per_s", "wall"), ("tokens_per_cpu_s", "CPU time")):
            paired = [p[key] / b[key] for p, b in zip(runs["ppo"], runs["bare"], strict=True)]
            best = max(r[key] for r in runs["ppo"]) / max(r[key] for r in runs["bare"])
            print(
                f"ratio ppo / bare ({unit}): {best:.3f} (best runs; goal >= 0.9) | paired runs: "
                f"{min(paired):.3f}-{max(paired):.3f} (median {statistics.median(paired):.3f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
