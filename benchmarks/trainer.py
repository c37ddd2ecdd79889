"""Trainer throughput: the full PPO update versus a bare forward+backward+optimizer step.

Same model (the ``small`` starter by default), same fresh LoRA, same samples, same padded
minibatches in the same order. The PPO side is ``ppo.run_policy_update`` exactly as training
runs it: batching, old log-probs recomputed under no_grad, the KL-to-base reference (free for a
fresh LoRA: it equals the base), the clipped loss with importance weights, entropy and all
per-step metrics. The bare side is the ceiling: log-probs of the same completion tokens,
``-mean`` as the loss, backward, AdamW step. ``target_kl`` is off so both sides take the same
number of steps. Figures are trained tokens (prompt + completion, no padding) per second.

    python benchmarks/trainer.py [--size small|tiny] [--base DIR] [--samples 32] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_trainer.config import PPOConfig  # noqa: E402
from gpu_trainer.policy import completion_logprobs, make_batch  # noqa: E402
from gpu_trainer.ppo import compute_advantages, load_policy, run_policy_update  # noqa: E402
from gpu_trainer.samples import Sample  # noqa: E402


def synthetic_samples(tokenizer, n: int, seed: int) -> list[Sample]:
    """FIM prompts cut from real stdlib source, completions of 0-32 tokens, serving logprobs."""
    import sysconfig

    from gpu_trainer.fim import build_fim_prompt

    rng = random.Random(seed)
    source = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()
    ids = [t for line in source.splitlines(keepends=True) for t in tokenizer.encode(line, add_special_tokens=False)]
    samples = []
    for _ in range(n):
        start = rng.randrange(0, len(ids) - 600)
        prefix_len, suffix_len = rng.randint(96, 320), rng.randint(16, 96)
        prefix = tokenizer.decode(ids[start : start + prefix_len])
        suffix = tokenizer.decode(ids[start + prefix_len + 40 : start + prefix_len + 40 + suffix_len])
        prompt = tokenizer.encode(build_fim_prompt("qwen", prefix, suffix), add_special_tokens=False)
        completion_len = rng.choice([0, 1, 4, 8, 16, 24, 32])
        completion = ids[start + prefix_len : start + prefix_len + completion_len]
        behaviour = [-rng.uniform(0.01, 3.0) for _ in completion] or None
        reward = 0.0 if not completion else rng.choice([0.75, -0.25, -0.25])
        samples.append(Sample(tuple(prompt), tuple(completion), tuple(behaviour) if behaviour else None, reward))
    return samples


def bare_steps(policy, samples: list[Sample], config: PPOConfig) -> int:
    """The ceiling: same partition and order as run_policy_update, nothing but the step."""
    model = policy.model
    generator = torch.Generator().manual_seed(config.seed)
    num_minibatches = min(config.num_minibatches, len(samples))
    order = torch.randperm(len(samples), generator=generator)
    parts = [p.tolist() for p in order.tensor_split(num_minibatches)]
    batches = [
        make_batch(
            [samples[i] for i in part],
            eos_id=policy.eos_id,
            pad_id=policy.pad_id,
            max_prompt_tokens=config.max_prompt_tokens,
            device=policy.device,
        )
        for part in parts
    ]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    model.train()
    tokens = 0
    for _ in range(config.epochs):
        for mb in torch.randperm(num_minibatches, generator=generator).tolist():
            batch = batches[mb]
            logprobs, _ = completion_logprobs(model, batch)
            loss = -(logprobs * batch.mask).sum() / batch.mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            tokens += batch.num_tokens
    return tokens


def ppo_update(policy, samples: list[Sample], config: PPOConfig) -> int:
    rewards = torch.tensor([s.reward for s in samples])
    advantages = compute_advantages(rewards, baseline=config.baseline, normalize=config.normalize_advantages)
    metrics, _ = run_policy_update(policy, samples, advantages, config, progress=False)
    return sum(m["tokens"] for m in metrics)


def timed(run, policy, samples: list[Sample], config: PPOConfig, *, parent_like: bool = False) -> float:
    """Tokens per second of one run, starting from the same fresh LoRA (or the same trained-looking
    one when ``parent_like``: lora_B non-zero, so the KL reference needs its own forward pass)."""
    _reset_lora(policy, config.seed, parent_like=parent_like)
    started = time.perf_counter()
    tokens = run(policy, samples, config)
    _sync(policy.device)
    return tokens / (time.perf_counter() - started)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _reset_lora(policy, seed: int, *, parent_like: bool = False) -> None:
    """Back to the same LoRA before every timed run: A random under the seed, B zero (fresh)
    or small random values (as a parent adapter would have)."""
    torch.manual_seed(seed)
    for module in policy.model.modules():
        if hasattr(module, "reset_lora_parameters") and hasattr(module, "lora_A"):
            module.reset_lora_parameters("default", True)
            if parent_like:
                with torch.no_grad():
                    module.lora_B["default"].weight.normal_(0, 1e-3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=("tiny", "small"))
    parser.add_argument("--base", help="any HF causal LM directory instead of the starter model")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side, interleaved")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--parent-like",
        action="store_true",
        help="also time an update of a non-fresh adapter (needs the reference forward pass)",
    )
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.base:
        base = Path(args.base)
    else:
        from gpu_trainer.starter import ensure_starter_model

        base = ensure_starter_model(args.size, progress=sys.stderr.isatty())
    config = PPOConfig(target_kl=None, device=args.device)
    policy = load_policy(config, base_model_dir=base, parent_adapter_dir=None)
    samples = synthetic_samples(policy.tokenizer, args.samples, seed=0)
    dtype = next(policy.model.parameters()).dtype

    timed(bare_steps, policy, samples[:8], config.replace(epochs=1))  # warm-up: allocator, kernels
    # Other processes share this machine's cores, and an OpenMP team that loses a core to them
    # slows down many times over, at random. Runs alternate between the two sides; the best run
    # of each side estimates its uncontended speed (noise only ever adds time), and the median
    # of the paired ratios (each PPO run over the bare run just before it) is printed as well.
    bare_runs, ppo_runs, parent_runs = [], [], []
    for _ in range(args.repeats):
        bare_runs.append(timed(bare_steps, policy, samples, config))
        ppo_runs.append(timed(ppo_update, policy, samples, config))
        if args.parent_like:
            parent_runs.append(timed(ppo_update, policy, samples, config, parent_like=True))
    bare_best = max(bare_runs)
    ppo_best = max(ppo_runs)
    paired = statistics.median(p / b for p, b in zip(ppo_runs, bare_runs, strict=True))

    print(
        f"model: {base.name} | device: {policy.device} {str(dtype).removeprefix('torch.')} | "
        f"threads: {torch.get_num_threads()} | samples: {len(samples)} | epochs x minibatches: "
        f"{config.epochs} x {config.num_minibatches} | kl_coef: {config.kl_coef} | LoRA rank {config.lora_rank} | "
        f"runs per side: {args.repeats}"
    )
    print(f"bare forward+backward+step: {bare_best:,.0f} tokens/s (best run)")
    print(f"ppo update (full):          {ppo_best:,.0f} tokens/s (best run)")
    print(f"ratio: {ppo_best / bare_best:.3f} (goal >= 0.7) | median of paired runs: {paired:.3f}")
    if parent_runs:
        print(
            f"ppo update, parent adapter (+ reference pass for KL to base): {max(parent_runs):,.0f} tokens/s "
            f"| ratio: {max(parent_runs) / bare_best:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
