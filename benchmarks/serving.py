"""Serving benchmark: completions straight to vLLM versus through Strop, and adapter load time.

Starts a real vLLM server (CPU build here) on the small starter model (or --model DIR), the API
under gunicorn on a fresh Postgres database, registers a LoRA version and promotes it, then sends
the same prompts at the same concurrency (a) to vLLM directly, naming the version, and (b) to
Strop's /v1/completions, which routes to that version and records every interaction. The two
sides alternate in short chunks, each side first in every other one, so that drift on a shared
machine and vLLM's prefix cache favour neither (throughput);
then each of --pairs other prompts goes both ways back to back on one worker (after one untimed
request, so vLLM's prefix cache serves both alike), and what Strop adds is the median of those
paired differences, with its interval. --stream streams both sides.
Then the concurrency sweep (benchmarks/serving_sweep.py): 1, 16, 64 and 256 at once, streamed and
not, against this vLLM and against a mock upstream paced per token, on one API process.
Prints one line per figure.

    make bench-serving        # or: python benchmarks/serving.py --requests 200 --concurrency 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from common import (
    DEFAULT_DATABASE_URL,
    ROOT,
    free_port,
    fresh_database,
    manage,
    percentile,
    setup_django,
    start_gunicorn,
    stop,
    wait_healthy,
)

sys.path.insert(0, str(ROOT))


def prompts_from_stdlib(count: int) -> list[str]:
    """Code prefixes cut from the standard library: realistic, and the same on every run."""
    import sysconfig

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    out: list[str] = []
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        for start in range(0, len(lines) - 12, 97):
            out.append("\n".join(lines[start : start + 12]) + "\n")
            if len(out) == count:
                return out
    return out


def start_vllm(model_dir: Path, port: int, log_path: Path, *extra_args: str, **extra_env: str) -> subprocess.Popen:
    env = dict(
        os.environ,
        VLLM_PORT=str(port),
        VLLM_SERVED_MODEL_NAME="base",
        VLLM_KV_CACHE_BYTES="512M",
        VLLM_MAX_MODEL_LEN="2048",
        VLLM_API_KEY="",  # a loopback vLLM of the benchmark's own: its direct calls send no key
        **extra_env,
    )
    subprocess.run(["bash", "platform/vllm-env.sh"], cwd=ROOT, check=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["bash", "platform/vllm.sh", str(model_dir), *extra_args],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_healthy(f"http://127.0.0.1:{port}/health", proc, 600, f"vLLM (log: {log_path})")
    return proc


def bench_adapter(model_dir: Path, db_url: str, **extra: str) -> tuple[str, Any, Any]:
    """Tenant "bench" (its rate limit out of the way) with a key, the base model registered and its
    default adapter "tab"; Django set up on ``db_url``. Returns (raw key, tenant, adapter)."""
    key = manage("tenant_create", "Bench", "--rate-limit", "100000000", "--key-only", db_url=db_url)
    manage("base_model_register", "base", str(model_dir), db_url=db_url)
    manage("adapter_create", "bench", "tab", "--base", "base", "--default", db_url=db_url)
    setup_django(db_url, **extra)
    from apps.adapters.models import Adapter
    from apps.tenants.models import Tenant

    tenant = Tenant.objects.get(slug="bench")
    return key, tenant, Adapter.objects.get(tenant=tenant, name="tab")


def run_load(url: str, bodies: list[dict], headers: dict, concurrency: int) -> tuple[float, list[float], int]:
    """Send every body once to ``url`` with ``concurrency`` workers; returns (elapsed, latencies, failures)."""
    return run_jobs([(url, body, headers) for body in bodies], concurrency)


def run_jobs(jobs: list[tuple[str, dict, dict]], concurrency: int) -> tuple[float, list[float], int]:
    """POST every (url, body, headers) once with ``concurrency`` workers: (elapsed, latencies, failures)."""
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()
    queue = list(reversed(jobs))

    def worker() -> None:
        nonlocal failures
        with httpx.Client(timeout=120) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    url, body, headers = queue.pop()
                start = time.perf_counter()
                response = http.post(url, json=body, headers=headers)
                elapsed = time.perf_counter() - start
                with lock:
                    latencies.append(elapsed)
                    failures += response.status_code != 200

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, latencies, failures


def run_paired(
    direct: tuple[str, list[dict], dict], strop: tuple[str, list[dict], dict], concurrency: int
) -> list[float]:
    """Each prompt straight to vLLM and through Strop back to back on the same worker (which goes
    first alternates), so both see the same load, after one untimed request that puts the prompt
    in vLLM's prefix cache for both; returns Strop's latency minus direct's, per prompt."""
    diffs: list[float] = []
    lock = threading.Lock()
    queue = list(reversed(range(len(direct[1]))))

    def worker() -> None:
        with httpx.Client(timeout=120) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    index = queue.pop()
                took = {}
                # Untimed first: vLLM's prefix cache then serves both timed requests alike.
                http.post(direct[0], json=direct[1][index], headers=direct[2])
                order = (("direct", direct), ("strop", strop))
                for side, (url, bodies, headers) in order if index % 2 == 0 else reversed(order):
                    start = time.perf_counter()
                    response = http.post(url, json=bodies[index], headers=headers)
                    took[side] = time.perf_counter() - start
                    if response.status_code != 200:
                        raise RuntimeError(f"{side} failed: {response.status_code} {response.text[:300]}")
                with lock:
                    diffs.append(took["strop"] - took["direct"])

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return diffs


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """The median with its distribution-free 95% interval (order statistics)."""
    ordered = sorted(values)
    n = len(ordered)
    half = 1.96 * n**0.5 / 2
    low, high = max(0, int(n / 2 - half)), min(n - 1, int(n / 2 + half))
    return statistics.median(ordered), ordered[low], ordered[high]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--model", help="base model directory (default: the small starter model)")
    parser.add_argument("--requests", type=int, default=160, help="requests per round and side")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--stream", action="store_true", help="streamed completions on both sides")
    parser.add_argument("--pairs", type=int, default=200, help="prompts sent both ways back to back")
    parser.add_argument("--levels", default="1,16,64,256", help="the sweep's concurrencies (empty: no sweep)")
    parser.add_argument("--no-real-sweep", action="store_true", help="sweep the mock upstream only")
    parser.add_argument("--mock-token-delay-ms", type=float, default=50.0)
    parser.add_argument("--mock-max-tokens", type=int, default=20)
    parser.add_argument("--hold", type=int, default=512, help="streams opened at once on one API process (mock)")
    args = parser.parse_args()

    from model_supply.starter import ensure_starter_model
    from tests.fixtures.vllm import write_random_lora

    model_dir = Path(args.model) if args.model else ensure_starter_model("small", progress=True)
    work = Path(tempfile.mkdtemp(prefix="strop-bench-serving-"))
    vllm_port, api_port = free_port(), free_port()
    vllm_url = f"http://127.0.0.1:{vllm_port}"
    db_url = fresh_database(args.database_url, "strop_bench_serving")
    extra = {"VLLM_BASE_URLS": vllm_url, "STROP_ADAPTER_ROOT": str(work / "adapters")}
    started = time.perf_counter()
    vllm = start_vllm(model_dir, vllm_port, work / "vllm.log")
    vllm_start_s = time.perf_counter() - started
    api = None
    try:
        key, tenant, adapter = bench_adapter(model_dir, db_url, **extra)
        from apps.adapters.loading import adapter_version_load
        from apps.adapters.services import adapter_version_promote, adapter_version_register
        from apps.engines.vllm import vllm_client

        load_times, register_times = [], []
        version = None
        for seed in range(3):
            source = write_random_lora(model_dir, work / f"lora-{seed}", seed=seed, rank=8)
            t0 = time.perf_counter()
            version = adapter_version_register(
                tenant, adapter=adapter, source_dir=source, parent=version, enqueue_load=False
            )
            t1 = time.perf_counter()
            assert adapter_version_load(version_id=version.pk) == "loaded"
            t2 = time.perf_counter()
            register_times.append(t1 - t0)
            load_times.append(t2 - t1)
            version.refresh_from_db()
        adapter_version_promote(tenant, version=version, actor="bench")
        assert version.vllm_name in {m.id for m in vllm_client().models()}

        api = start_gunicorn(db_url, api_port, args.workers, **extra)
        prompts = prompts_from_stdlib(args.requests)
        common_params = {"max_tokens": args.max_tokens, "temperature": 0.0, "seed": 1, "stream": args.stream}
        direct_bodies = [
            {"model": version.vllm_name, "prompt": p, "logprobs": 1, "return_token_ids": True, **common_params}
            | ({"stream_options": {"include_usage": True}} if args.stream else {})
            for p in prompts
        ]
        strop_bodies = [{"prompt": p, "user": f"dev-{i % 20}", **common_params} for i, p in enumerate(prompts)]
        strop_headers = {"Authorization": f"Bearer {key}"}
        run_load(f"{vllm_url}/v1/completions", direct_bodies[:8], {}, args.concurrency)  # warm both paths
        run_load(f"http://127.0.0.1:{api_port}/v1/completions", strop_bodies[:8], strop_headers, args.concurrency)
        results: dict[str, dict[str, list]] = {
            "direct": {"t": [], "lat": [], "fail": []},
            "strop": {"t": [], "lat": [], "fail": []},
        }
        # Short alternating chunks (the same prompts on both sides), so drift on a shared
        # machine lands on both sides alike.
        chunk = args.concurrency * 5
        for _ in range(args.rounds):
            for offset in range(0, len(prompts), chunk):
                sides = (
                    ("direct", f"{vllm_url}/v1/completions", direct_bodies[offset : offset + chunk], {}),
                    (
                        "strop",
                        f"http://127.0.0.1:{api_port}/v1/completions",
                        strop_bodies[offset : offset + chunk],
                        strop_headers,
                    ),
                )
                # Which side sends a chunk's prompts first (and fills vLLM's prefix cache) alternates.
                for side, url, bodies, headers in sides if (offset // chunk) % 2 == 0 else reversed(sides):
                    elapsed, latencies, failures = run_load(url, bodies, headers, args.concurrency)
                    results[side]["t"].append(elapsed)
                    results[side]["lat"].extend(latencies)
                    results[side]["fail"].append(failures)
        pair_prompts = prompts_from_stdlib(args.requests + args.pairs)[args.requests :]
        diffs = run_paired(
            (
                f"{vllm_url}/v1/completions",
                [{**direct_bodies[0], "prompt": p} for p in pair_prompts],
                {},
            ),
            (
                f"http://127.0.0.1:{api_port}/v1/completions",
                [{**strop_bodies[i % len(strop_bodies)], "prompt": p} for i, p in enumerate(pair_prompts)],
                strop_headers,
            ),
            args.concurrency,
        )
        from apps.interactions.models import Interaction

        recorded = Interaction.objects.filter(tenant=tenant, adapter_version=version).count()
        if args.levels:
            from serving_sweep import run_sweeps

            run_sweeps(
                db_url=db_url,
                extra_env=extra,
                vllm_url=vllm_url,
                api_port=api_port,
                api_pid=api.pid,
                direct_bodies=direct_bodies,
                strop_bodies=strop_bodies,
                headers=strop_headers,
                real_c1_added_ms=median_interval(diffs)[0] * 1000,
                levels=tuple(int(c) for c in args.levels.split(",")),
                token_delay_ms=args.mock_token_delay_ms,
                max_tokens=args.mock_max_tokens,
                hold=args.hold,
                real=not args.no_real_sweep,
            )
    finally:
        if api is not None:
            stop(api)
        stop(vllm)

    n = args.requests * args.rounds
    summary = {}
    for side in ("direct", "strop"):
        lat = results[side]["lat"]
        summary[side] = (
            n / sum(results[side]["t"]),
            statistics.median(lat) * 1000,
            percentile(lat, 0.99) * 1000,
            sum(results[side]["fail"]),
        )
    print(
        f"model: {model_dir.name}; {n} requests per side, alternating in chunks of {args.concurrency * 5}, concurrency "
        f"{args.concurrency}, max_tokens {args.max_tokens}, {'streamed' if args.stream else 'not streamed'}; "
        f"{os.cpu_count()} cores; vLLM start {vllm_start_s:.0f} s"
    )
    for side, label in (("direct", "vLLM direct"), ("strop", "through Strop")):
        rps, p50, p99, fails = summary[side]
        print(f"{label:<14} {rps:6.1f} req/s   p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   failed {fails}")
    print(f"p50 through Strop - p50 direct: {summary['strop'][1] - summary['direct'][1]:.1f} ms")
    added, low, high = (x * 1000 for x in median_interval(diffs))
    print(
        f"Strop adds at p50 (median of {len(diffs)} paired requests): {added:.1f} ms, "
        f"95% interval [{low:.1f}, {high:.1f}] (goal <= 3 ms)"
    )
    print(f"throughput kept: {summary['strop'][0] / summary['direct'][0]:.2f} of direct (goal >= 0.95)")
    print(f"interactions recorded: {recorded} of {n + 8 + len(diffs)} served through Strop")
    print(
        f"new adapter version: register (verify + copy) {statistics.median(register_times) * 1000:.0f} ms, "
        f"load on vLLM {statistics.median(load_times) * 1000:.0f} ms (median of {len(load_times)})"
    )


if __name__ == "__main__":
    main()
