"""Freshness: from the Nth feedback event accepted by the API to the new version answering in vLLM.

Production shape on one machine: Postgres, Redis, a real vLLM server (CPU build here) on the small
starter model or SmolLM2-135M-Instruct (``--model smollm2``), the API under gunicorn, Celery
workers for the default/serving and gpu queues (the trainer on the one core vLLM leaves free).
N completions at cursors inside lines of real code (``simdev``'s train split) are served through
the Python SDK to opted-in developers of one population (``--population``, default ``line``:
accepted only when exactly the rest of the line), who label each one. The clock starts when
the API accepts the Nth feedback event; it stops when the trained version answers a completion
in vLLM. Traffic keeps flowing through Strop the whole time; every failed request is counted.

    make bench-freshness      # or: python benchmarks/freshness.py --events 256 [--model smollm2]

Requests carry the demo editors' window of the file (``--prefix-chars``) and their stop string
(a line break for ``line`` developers, a blank line for ``block`` ones). Goals: 30 s on the
starter model, 5 minutes on SmolLM2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
from common import (
    DEFAULT_DATABASE_URL,
    ROOT,
    django_env,
    free_port,
    fresh_database,
    manage,
    setup_django,
    start_gunicorn,
    stop,
)
from serving import start_vllm
from simdev import POPULATIONS, Context, deliver_feedback, load_tasks, run_session
from strop import Strop, StropError

sys.path.insert(0, str(ROOT))

# What each population's editor sends as its stop string (as in the demo).
STOPS = {"line": ["\n"], "block": ["\n\n"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--model", help="smollm2, or a base model directory (default: the small starter model)")
    parser.add_argument("--no-autocast", dest="autocast", action="store_const", const="0", default="auto",
                        help="train in fp32 (default: bf16 autocast where bf16 is native, TRAINER_AUTOCAST_BF16="
                        "auto: ~1.65x with AMX, ~2.3x with AVX-512 bf16, ~10x slower without)")
    parser.add_argument("--prefix-chars", type=int, default=500, help="characters of the file before the cursor")
    parser.add_argument("--events", type=int, default=256, help="labelled events that start a run (N)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--population", choices=POPULATIONS, default="line", help="the developers who label")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--traffic-rps", type=float, default=5.0, help="completions per second during the cycle")
    parser.add_argument("--trainer", default="{}", help="JSON of PPOConfig overrides for the tenant's policy")
    args = parser.parse_args()

    from model_supply.starter import ensure_starter_model
    from tests.fixtures.workers import Workers

    if args.model == "smollm2":
        from model_supply.base_models import ensure_smollm2

        model_dir = Path(ensure_smollm2())
    else:
        model_dir = Path(args.model) if args.model else ensure_starter_model("small", progress=True)
    goal_s = 30.0 if "starter" in model_dir.name else 300.0
    stop_strings = STOPS[args.population]
    work = Path(tempfile.mkdtemp(prefix="strop-bench-freshness-"))
    vllm_port, api_port = free_port(), free_port()
    vllm_url, api_url = f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{api_port}"
    db_url = fresh_database(args.database_url, "strop_bench_freshness")
    extra = {
        "VLLM_BASE_URLS": vllm_url,
        "STROP_ADAPTER_ROOT": str(work / "adapters"),
        "STROP_RUN_ROOT": str(work / "runs"),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"),
        "TRAINER_AUTOCAST_BF16": args.autocast,
    }
    env = django_env(db_url, **extra)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(start_vllm(model_dir, vllm_port, work / "vllm.log"))
        key = manage("tenant_create", "Fresh", "--rate-limit", "100000000", "--key-only", db_url=db_url, **extra)
        manage("base_model_register", "base", str(model_dir), db_url=db_url, **extra)
        manage("adapter_create", "fresh", "tab", "--base", "base", "--default", db_url=db_url, **extra)
        setup_django(db_url, **extra)
        from config.celery import app

        app.control.purge()
        from apps.adapters.models import Adapter
        from apps.training.models import TrainingPolicy, TrainingRun

        adapter = Adapter.objects.get(name="tab", tenant__slug="fresh")
        TrainingPolicy.objects.create(
            tenant=adapter.tenant,
            adapter=adapter,
            min_new_events=args.events,
            heldout_fraction=0.1,
            max_wait_s=10**6,
            trainer_overrides=json.loads(args.trainer),
        )
        procs.append(start_gunicorn(db_url, api_port, 2, **extra))
        workers = Workers(env=env, log_dir=work)
        procs.append(workers.start("default", "default,serving", "threads"))
        procs.append(workers.start_gpu())

        client = Strop(base_url=api_url, api_key=key, timeout=120)
        tasks = load_tasks("train", args.events, context=Context(max_prefix_chars=args.prefix_chars))
        developers = [f"dev-{i}" for i in range(16)]
        session = run_session(
            client,
            tasks,
            args.population,
            users=developers,
            max_tokens=args.max_tokens,
            stop=stop_strings,
            concurrency=4,
            send_feedback=False,
        )
        summary = session.summary()
        labels = session.feedback_items()
        recorded = deliver_feedback(client, labels[:-1])
        assert recorded == args.events - 1, f"{recorded} of {args.events - 1} feedback events recorded"

        failures: list[str] = []
        traffic_count = 0
        stop_traffic = threading.Event()

        def traffic() -> None:
            nonlocal traffic_count
            # No retries: every request that fails is counted.
            with Strop(base_url=api_url, api_key=key, timeout=60, max_retries=0) as traffic_client:
                k = 0
                while not stop_traffic.wait(1.0 / args.traffic_rps):
                    task = tasks[k % len(tasks)]
                    try:
                        traffic_client.completions.create(
                            prefix=task.prefix, suffix=task.suffix, max_tokens=8, stop=stop_strings, user="dev-traffic"
                        )
                    except StropError as exc:
                        failures.append(repr(exc)[:160])
                    traffic_count += 1
                    k += 1

        traffic_thread = threading.Thread(target=traffic, daemon=True)
        traffic_thread.start()
        time.sleep(1)
        last = client.feedback.send(**labels[-1])
        t0 = time.time()
        assert last.status == "recorded", last

        deadline = t0 + args.timeout
        run = None
        while time.time() < deadline:
            run = TrainingRun.objects.filter(adapter=adapter).select_related("output_version").first()
            if run is not None and run.status in ("candidate", "rejected", "failed"):
                break
            time.sleep(0.1)
        if run is None or run.status != "candidate":
            raise SystemExit(f"no candidate: {run and run.status} {run and run.error[:2000]} {run and run.gate}")
        version = run.output_version
        while True:  # the moment the new version answers in vLLM
            r = httpx.post(
                f"{vllm_url}/v1/completions",
                json={"model": version.vllm_name, "prompt": "def f(x):\n", "max_tokens": 4},
                timeout=60,
            )
            if r.status_code == 200:
                t_answer = time.time()
                break
            time.sleep(0.05)
        stop_traffic.set()
        traffic_thread.join(timeout=120)
    finally:
        for proc in reversed(procs):
            stop(proc)

    import torch

    from gpu_trainer.precision import autocast_setting

    def ts(value: datetime) -> float:
        return value.timestamp()

    stages = run.stage_seconds
    print(
        f"model: {model_dir.name}; N = {args.events} labelled events by {args.population} developers "
        f"({summary.shown} shown, {summary.accepted} accepted), {os.cpu_count()} cores, no GPU"
    )
    print(
        f"window: {run.window_size} trained + {run.heldout_size} held out; trainer: "
        f"{run.trainer_summary.get('tokens_per_second', run.trainer_summary.get('tokens_per_s', '?'))} tokens/s, "
        f"bf16 autocast {'on' if autocast_setting(args.autocast, torch.device('cpu')) else 'off'} "
        f"(TRAINER_AUTOCAST_BF16={args.autocast})"
    )
    print(f"wait for schedule   {ts(run.created_at) - t0:6.2f} s   (Nth event accepted -> run created)")
    print(
        f"queue wait          {ts(run.started_at) - ts(run.created_at):6.2f} s   (run created -> gpu worker claims it)"
    )
    for stage in ("export", "train", "gate", "load"):
        print(f"{stage:<19} {stages.get(stage, float('nan')):6.2f} s")
    print(f"first answer        {t_answer - ts(run.finished_at):6.2f} s   (run finished -> version answers in vLLM)")
    print(f"total               {t_answer - t0:6.2f} s   (goal < {goal_s:g} s)")
    print(
        f"gate: passed={run.gate.get('passed')} kl_to_parent={run.gate.get('kl_to_parent')} "
        f"reward candidate={run.gate.get('reward_candidate')} parent={run.gate.get('reward_parent')}"
    )
    print(
        f"serving during the cycle: {traffic_count} requests (paced at {args.traffic_rps:g}/s), {len(failures)} failed"
    )
    for failure in failures[:5]:
        print("  failed:", failure)


if __name__ == "__main__":
    main()
