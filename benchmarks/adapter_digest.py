"""The sha256 of the adapter one seeded PPO update writes on the tiny starter model.

A check for moves that must not change what the trainer learns: run it before and after, and
the two digests must be the same. Prints ``adapter_sha256: <hex>``.

    python benchmarks/adapter_digest.py
"""

from __future__ import annotations

import hashlib
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import torch

    from gpu_trainer.config import PPOConfig
    from gpu_trainer.ppo import train_ppo
    from learning_shared.samples import Sample

    try:
        from model_supply.starter import ensure_starter_model
    except ImportError:  # before model supply left the trainer's package
        from gpu_trainer.starter import ensure_starter_model  # type: ignore[no-redef]

    torch.set_num_threads(1)
    base = ensure_starter_model("tiny")
    rng = random.Random(0)
    samples = []
    for i in range(16):
        completion = [rng.randrange(5, 2000) for _ in range(rng.randrange(0, 4))]
        samples.append(
            Sample.from_dict(
                {
                    "id": str(i),
                    "prompt_token_ids": [rng.randrange(5, 2000) for _ in range(12)],
                    "completion_token_ids": completion,
                    "behaviour_logprobs": [-1.5] * len(completion) if completion else None,
                    "reward": rng.choice([0.75, -0.25, 0.0]),
                    "token_rewards": [0.75] * len(completion) if completion and i % 5 == 0 else None,
                },
                i,
            )
        )
    config = PPOConfig(seed=7, epochs=2, num_minibatches=2, target_kl=None)
    with tempfile.TemporaryDirectory() as out:
        result = train_ppo(config, samples, base_model_dir=base, out_dir=Path(out) / "adapter", progress=False)
        digest = hashlib.sha256((result.out_dir / "adapter_model.safetensors").read_bytes()).hexdigest()
    print(f"adapter_sha256: {digest}")


if __name__ == "__main__":
    main()
