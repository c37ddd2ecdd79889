"""Capacity benchmark: two API processes and two vLLM replicas on loopback, many tenants' adapters.

Starts two vLLM replicas (the small starter model, few LoRA slots each: --max-loras), two API
processes (gunicorn, one worker each) on one Postgres and Redis, and --tenants tenants, each with
a promoted LoRA version loaded on both replicas. Then, for each routing mode (VLLM_ROUTING: tenant
and round_robin), it sends the same completions (a random tenant each, alternating API processes)
and reads the replicas' request logs to count which replica served which tenant's adapter.
Prints requests/s and latency per mode, how many tenants stayed on one replica, and how many
adapters each replica had to keep warm.

    python benchmarks/capacity.py --tenants 8 --requests 240 --concurrency 4
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

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
)
from serving import prompts_from_stdlib, run_jobs, start_vllm

sys.path.insert(0, str(ROOT))

LORA_IN_LOG = re.compile(r"lora_name='([^']+)'")


def served_adapters(log: Path, offset: int) -> tuple[list[str], int]:
    """LoRA names of the requests a replica logged after ``offset`` bytes; the new offset."""
    data = log.read_bytes()
    return LORA_IN_LOG.findall(data[offset:].decode(errors="replace")), len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--requests", type=int, default=240, help="completions per routing mode")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-loras", type=int, default=2, help="LoRA slots per replica (vLLM --max-loras)")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()

    from model_supply.starter import ensure_starter_model
    from tests.fixtures.vllm import write_random_lora

    model_dir = ensure_starter_model("small", progress=True)
    work = Path(tempfile.mkdtemp(prefix="strop-bench-capacity-"))
    vllm_ports = [free_port(), free_port()]
    vllm_urls = [f"http://127.0.0.1:{p}" for p in vllm_ports]
    logs = [work / f"vllm-{i}.log" for i in range(2)]
    db_url = fresh_database(args.database_url, "strop_bench_capacity")
    extra = {"VLLM_BASE_URLS": ",".join(vllm_urls), "STROP_ADAPTER_ROOT": str(work / "adapters")}
    replicas = []
    apis: list = []
    try:
        for port, log in zip(vllm_ports, logs, strict=True):
            replicas.append(
                start_vllm(model_dir, port, log, "--enable-log-requests", VLLM_MAX_LORAS=str(args.max_loras))
            )
        manage("base_model_register", "base", str(model_dir), db_url=db_url)
        keys: dict[str, str] = {}
        for n in range(args.tenants):
            slug = f"t{n}"
            keys[slug] = manage(
                "tenant_create", slug, "--rate-limit", "100000000", "--key-only", db_url=db_url, **extra
            )
            manage("adapter_create", slug, "tab", "--base", "base", "--default", db_url=db_url)
        setup_django(db_url, **extra)
        from apps.adapters.loading import adapter_version_load
        from apps.adapters.models import Adapter
        from apps.adapters.services import adapter_version_promote, adapter_version_register

        version_tenant: dict[str, str] = {}
        for n, slug in enumerate(keys):
            adapter = Adapter.objects.get(tenant__slug=slug, name="tab")
            source = write_random_lora(model_dir, work / f"lora-{slug}", seed=n, rank=8)
            version = adapter_version_register(adapter.tenant, adapter=adapter, source_dir=source, enqueue_load=False)
            assert adapter_version_load(version_id=version.pk) == "loaded"  # on both replicas
            version.refresh_from_db()
            adapter_version_promote(adapter.tenant, version=version, actor="bench")
            version_tenant[version.vllm_name] = slug

        rng = random.Random(7)
        prompts = prompts_from_stdlib(args.requests)
        tenants_of_request = [rng.choice(list(keys)) for _ in prompts]
        offsets = [0, 0]
        results = {}
        for mode in ("tenant", "round_robin"):
            api_ports = [free_port(), free_port()]
            apis = [start_gunicorn(db_url, port, 1, VLLM_ROUTING=mode, **extra) for port in api_ports]
            try:
                jobs = [
                    (
                        f"http://127.0.0.1:{api_ports[i % 2]}/v1/completions",
                        {"prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0.0, "user": f"dev-{i % 16}"},
                        {"Authorization": f"Bearer {keys[slug]}"},
                    )
                    for i, (prompt, slug) in enumerate(zip(prompts, tenants_of_request, strict=True))
                ]
                run_jobs(jobs[:8], args.concurrency)  # warm both processes
                for i in range(2):
                    offsets[i] = served_adapters(logs[i], 0)[1]
                elapsed, latencies, failures = run_jobs(jobs, args.concurrency)
            finally:
                for api in apis:
                    stop(api)
                apis = []
            replicas_of = defaultdict(set)
            adapters_on: list[set[str]] = []
            for i in range(2):
                names, offsets[i] = served_adapters(logs[i], offsets[i])
                adapters_on.append({name for name in names if name in version_tenant})
                for name in adapters_on[-1]:
                    replicas_of[version_tenant[name]].add(i)
            results[mode] = (elapsed, latencies, failures, replicas_of, adapters_on)
    finally:
        for api in apis:
            stop(api)
        for proc in replicas:
            stop(proc)

    print(
        f"{args.tenants} tenants, each with a promoted adapter on both replicas; 2 vLLM replicas "
        f"(--max-loras {args.max_loras}), 2 API processes; {args.requests} completions of {args.max_tokens} tokens "
        f"per mode, concurrency {args.concurrency}; {os.cpu_count()} cores"
    )
    for mode, (elapsed, latencies, failures, replicas_of, adapters_on) in results.items():
        one = sum(1 for slug in keys if len(replicas_of.get(slug, ())) == 1)
        warm = " / ".join(str(len(names)) for names in adapters_on)
        print(
            f"VLLM_ROUTING={mode:<12} {len(latencies) / elapsed:5.1f} req/s   "
            f"p50 {statistics.median(latencies) * 1000:6.1f} ms   p99 {percentile(latencies, 0.99) * 1000:6.1f} ms   "
            f"failed {failures}   tenants on one replica: {one} of {len(keys)}   adapters served per replica: {warm}"
        )


if __name__ == "__main__":
    main()
