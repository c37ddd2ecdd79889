"""Serving A/B: what this checkout's proxy adds against another checkout's, in one run.

Between runs of benchmarks/serving.py on this shared 2-core machine, what Strop adds moves by more
than a change worth a millisecond or two. Here one vLLM server (the starter model, a promoted LoRA
version) and one fresh database serve two gunicorns side by side, one running this checkout and
one running ``--other`` (another commit's working tree, e.g. from ``git worktree add``, using this
checkout's Python environment and the same migrations). Each prompt goes once untimed straight to
vLLM (its prefix cache then serves every side alike), then straight to vLLM, through this checkout
and through the other, in a shuffled order, from one client. Prints the paired medians of the
differences with their 95 % intervals.

    git worktree add /tmp/before <commit>
    python benchmarks/serving_ab.py --other /tmp/before [--pairs 300] [--stream]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from common import DEFAULT_DATABASE_URL, ROOT, free_port, fresh_database, start_gunicorn, stop
from serving import bench_adapter, median_interval, prompts_from_stdlib, start_vllm

WARM_UP = 20  # prompts sent every way before the timed ones


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", required=True, type=Path, help="the other checkout's directory")
    parser.add_argument("--pairs", type=int, default=300, help="timed prompts")
    parser.add_argument("--stream", action="store_true", help="streamed completions on every side")
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    args = parser.parse_args()

    from model_supply.starter import ensure_starter_model
    from tests.fixtures.vllm import write_random_lora

    model_dir = ensure_starter_model("small", progress=True)
    work = Path(tempfile.mkdtemp(prefix="strop-bench-ab-"))
    vllm_port, this_port, other_port = free_port(), free_port(), free_port()
    vllm_url = f"http://127.0.0.1:{vllm_port}"
    db_url = fresh_database(args.database_url, "strop_bench_serving_ab")
    extra = {"VLLM_BASE_URLS": vllm_url, "STROP_ADAPTER_ROOT": str(work / "adapters")}
    vllm = start_vllm(model_dir, vllm_port, work / "vllm.log")
    apis: list[subprocess.Popen] = []
    try:
        key, tenant, adapter = bench_adapter(model_dir, db_url, **extra)
        from apps.adapters.loading import adapter_version_load
        from apps.adapters.services import adapter_version_promote, adapter_version_register

        source = write_random_lora(model_dir, work / "lora", seed=0, rank=8)
        version = adapter_version_register(tenant, adapter=adapter, source_dir=source, enqueue_load=False)
        assert adapter_version_load(version_id=version.pk) == "loaded"
        version.refresh_from_db()
        adapter_version_promote(tenant, version=version, actor="bench")
        for root, port in ((ROOT, this_port), (args.other.resolve(), other_port)):  # one worker each, 4 threads
            apis.append(start_gunicorn(db_url, port, 1, log=subprocess.DEVNULL, root=root, **extra))

        sampling = {"max_tokens": 16, "temperature": 0.0, "seed": 1, "stream": args.stream}
        auth = {"Authorization": f"Bearer {key}"}
        direct = {"model": version.vllm_name, "logprobs": 1, "return_token_ids": True, **sampling}
        sides = {
            "direct": (f"{vllm_url}/v1/completions", direct, {}),
            "this": (f"http://127.0.0.1:{this_port}/v1/completions", sampling, auth),
            "other": (f"http://127.0.0.1:{other_port}/v1/completions", sampling, auth),
        }
        took: dict[str, list[float]] = {side: [] for side in sides}
        shuffle = random.Random(7).shuffle
        with httpx.Client(timeout=120) as http:
            for n, prompt in enumerate(prompts_from_stdlib(args.pairs + WARM_UP)):
                http.post(sides["direct"][0], json={**direct, "prompt": prompt})  # vLLM's prefix cache
                order = list(sides)
                shuffle(order)
                for side in order:
                    url, body, headers = sides[side]
                    body = {**body, "prompt": prompt} | ({} if side == "direct" else {"user": f"dev-{n % 20}"})
                    start = time.perf_counter()
                    response = http.post(url, json=body, headers=headers)
                    elapsed = time.perf_counter() - start
                    if response.status_code != 200:
                        raise RuntimeError(f"{side} failed: {response.status_code} {response.text[:300]}")
                    if n >= WARM_UP:
                        took[side].append(elapsed)
    finally:
        for api in apis:
            stop(api)
        stop(vllm)

    print(
        f"{args.pairs} prompts, each straight to vLLM and through both checkouts in a shuffled order, "
        f"{'streamed' if args.stream else 'not streamed'}; this: {ROOT}, other: {args.other}"
    )
    for first, second in (("other", "direct"), ("this", "direct"), ("this", "other")):
        diffs = [a - b for a, b in zip(took[first], took[second], strict=True)]
        median, low, high = (x * 1000 for x in median_interval(diffs))
        print(f"{first} - {second}: {median:.2f} ms, 95% interval [{low:.2f}, {high:.2f}] (paired median)")
    for side, times in took.items():
        print(f"{side}: p50 {statistics.median(times) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
