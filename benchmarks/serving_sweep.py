"""The concurrency sweep of ``make bench-serving``: the same completions straight to the upstream
and through Strop at 1, 16, 64 and 256 at once, streamed and not, against the real vLLM and
against benchmarks/mock_vllm.py (vLLM's wire format, a fixed delay per token: what the API itself
can hold, beyond what a CPU vLLM can serve); then a burst of streams held at once on one API
process. The load comes from one asyncio client (benchmarks/light_http.py, a keep-alive connection
per concurrent caller); the two sides alternate level by level.

Per level and mode it prints ``name: value`` lines:
  added_p50_ms / added_p99_ms   latency through Strop minus direct, at the median and the 99th
                                percentile (a stream: to its last byte)
  overhead_header_p50_ms / _p99 what Strop says it added (X-Strop-Overhead-Ms; a stream: up to its
                                first byte)
  throughput_kept               completions/s through Strop over direct
  streams_held                  most streams open at once through Strop (first byte in, last not)
  cpu_ms_per_completion         the API processes' CPU time (user + system) per completion
  refusals                      answers that were not 200 (429 / 503 included)
and where the machine's CPU went, per side (``_direct`` / ``_strop``):
  machine_cores_busy_*          cores busy on the whole machine while that side ran (of cpu_count)
  client_cpu_ms_*               this load generator's CPU per completion
  upstream_cpu_ms_*             the mock's CPU per completion (the mock only)
  postgres_cpu_ms_*             every Postgres process's CPU per completion
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from light_http import Answer, Connection

LEVELS = (1, 16, 64, 256)
# Completions per level: this many times the level, so that a level is mostly its steady state. The
# first wave starts all at once and the API takes every request's setup together; at 2 waves (the
# sweep before 2026-11-28) that start was most of what "throughput kept" measured.
WAVES = 8
T = TypeVar("T")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (OSError once it is gone)."""
    stat = open(f"/proc/{pid}/stat").read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree_cpu_s(root_pid: int) -> float:
    """User + system CPU seconds of ``root_pid`` and every process under it (gunicorn's workers)."""
    total, pending = 0.0, [root_pid]
    while pending:
        pid = pending.pop()
        try:
            total += process_cpu_s(pid)
            for task in os.listdir(f"/proc/{pid}/task"):
                pending.extend(int(c) for c in open(f"/proc/{pid}/task/{task}/children").read().split())
        except (OSError, ValueError):
            continue  # gone meanwhile
    return total


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core; /proc/stat less idle and iowait)."""
    values = [int(v) for v in open("/proc/stat").readline().split()[1:9]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_s() -> float:
    """User + system CPU seconds of every process named ``postgres`` on this machine (a backend that
    exits meanwhile takes its share with it: the API's connections stay open through a level)."""
    total = 0.0
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "postgres":
                total += process_cpu_s(int(pid))
        except (OSError, ValueError):
            continue
    return total


@dataclass
class CpuMeter:
    """Where the machine's CPU goes while one side runs: the machine, the API (``api_pid``'s
    process tree), this client, the upstream (``upstream_pid``; 0: not measured) and Postgres, in
    seconds since :meth:`start`."""

    api_pid: int
    upstream_pid: int = 0
    readings: dict[str, float] = field(default_factory=dict)

    def _read(self) -> dict[str, float]:
        return {
            "machine": machine_busy_s(),
            "api": process_tree_cpu_s(self.api_pid),
            "client": time.process_time(),
            "upstream": process_tree_cpu_s(self.upstream_pid) if self.upstream_pid else 0.0,
            "postgres": postgres_cpu_s(),
        }

    def start(self) -> None:
        self.readings = self._read()

    def stop(self) -> dict[str, float]:
        return {name: value - self.readings[name] for name, value in self._read().items()}


@dataclass
class Side:
    """One side's run at one level: latencies, Strop's own overhead headers, refusals, timing."""

    latencies: list[float] = field(default_factory=list)
    overheads: list[float] = field(default_factory=list)
    refusals: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # by status, code and message
    elapsed: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # CpuMeter.stop's seconds while it ran
    held_max: int = 0

    def refuse(self, response: Answer) -> None:
        self.refusals += 1
        try:
            error = response.json()["error"]
            why = f"{error.get('code')}: {error.get('message', '')[:160]}"
        except (ValueError, KeyError, TypeError, AttributeError):
            why = response.text[:160]
        self.refused[f"{response.status} {why}"] += 1


async def run_side(url: str, bodies: list[dict], headers: dict, concurrency: int, stream: bool) -> Side:
    """Every body once, ``concurrency`` at a time, each caller on a keep-alive connection of its own
    (benchmarks/light_http.py); a stream is read to its end."""
    side, queue = Side(), list(reversed(bodies))
    path = urlsplit(url).path
    held = 0

    def opened() -> None:
        nonlocal held
        held += 1
        side.held_max = max(side.held_max, held)

    async def one(connection: Connection, body: dict) -> None:
        nonlocal held
        start = time.perf_counter()
        try:
            answer = await connection.post(path, body, headers, on_headers=opened if stream else None)
        finally:
            if stream:
                held -= 1
        if answer.status != 200:
            side.refuse(answer)
            return
        side.latencies.append(time.perf_counter() - start)
        if "x-strop-overhead-ms" in answer.headers:
            side.overheads.append(float(answer.headers["x-strop-overhead-ms"]))

    async def caller() -> None:
        connection = Connection(url)
        try:
            while queue:
                await one(connection, queue.pop())
        finally:
            await connection.close()

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    side.elapsed = time.perf_counter() - start
    return side


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` on uvloop, as the API's workers run (asyncio's own loop where it is missing): the
    load generator's CPU comes out of the same two cores as the API's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def sweep(
    label: str,
    *,
    direct: tuple[str, Callable[[int], dict], dict],
    strop: tuple[str, Callable[[int], dict], dict],
    api_pid: int,
    levels: tuple[int, ...] = LEVELS,
    requests: Callable[[int], int] = lambda c: max(64, WAVES * c),
    upstream_pid: int = 0,
) -> dict[tuple[str, int], dict[str, float]]:
    """Each level streamed and not, each side in turn (which goes first alternates); prints and
    returns the figures by (mode, level). ``upstream_pid``: the mock's process, whose CPU is
    counted too."""
    figures: dict[tuple[str, int], dict[str, float]] = {}
    for stream in (False, True):
        mode = "streamed" if stream else "whole"
        for turn, level in enumerate(levels):
            n = requests(level)
            runs: dict[str, Side] = {}
            order = [("direct", direct), ("strop", strop)]
            for side, (url, body, headers) in order if turn % 2 == 0 else reversed(order):
                bodies = [{**body(i), "stream": stream} for i in range(n)]
                for sent in bodies if not stream else []:
                    sent.pop("stream_options", None)  # vLLM refuses it on a whole completion
                await run_side(url, bodies[: min(level, 8)], headers, level, stream)  # warm
                meter = CpuMeter(api_pid, upstream_pid)
                meter.start()
                runs[side] = await run_side(url, bodies, headers, level, stream)
                runs[side].cpu = meter.stop()
            d, s = runs["direct"], runs["strop"]
            served = max(1, len(s.latencies))
            out = {
                "added_p50_ms": (_pct(s.latencies, 0.5) - _pct(d.latencies, 0.5)) * 1000,
                "added_p99_ms": (_pct(s.latencies, 0.99) - _pct(d.latencies, 0.99)) * 1000,
                "overhead_header_p50_ms": _pct(s.overheads, 0.5),
                "overhead_header_p99_ms": _pct(s.overheads, 0.99),
                "throughput_kept": (len(s.latencies) / s.elapsed) / max(1e-9, len(d.latencies) / d.elapsed),
                "direct_completions_per_s": len(d.latencies) / d.elapsed,
                "streams_held": float(s.held_max),
                "cpu_ms_per_completion": s.cpu["api"] * 1000 / served,
                "refusals": float(s.refusals + d.refusals),
            }
            for name, run in (("direct", d), ("strop", s)):
                done = max(1, len(run.latencies))
                out[f"machine_cores_busy_{name}"] = run.cpu["machine"] / max(1e-9, run.elapsed)
                for part in ("client", "upstream", "postgres"):
                    if part != "upstream" or upstream_pid:
                        out[f"{part}_cpu_ms_{name}"] = run.cpu[part] * 1000 / done
            figures[(mode, level)] = out
            for name, value in out.items():
                print(f"{label}_{mode}_c{level}_{name}: {value:.2f}", flush=True)
    return figures


async def hold_streams(url: str, body: dict, headers: dict, count: int) -> tuple[int, int]:
    """``count`` streams opened at once; (most open at the same time, refusals). Prints why each
    kind of refusal was refused."""
    side = await run_side(url, [{**body, "stream": True}] * count, headers, count, True)
    for why, times in side.refused.most_common(5):
        print(f"mock_hold_refused_why: {times} x {why}")
    return side.held_max, side.refusals


def print_goals(mock: dict[tuple[str, int], dict[str, float]], held: tuple[int, int], real_c1: float) -> None:
    """The issue's goals, each beside its figure (one API process on the mock; the real vLLM at 1)."""
    kept = [mock[(m, c)]["throughput_kept"] for m in ("whole", "streamed") for c in (64, 256) if (m, c) in mock]
    p50 = [mock[(m, 64)]["added_p50_ms"] for m in ("whole", "streamed") if (m, 64) in mock]
    p99 = [mock[(m, 64)]["added_p99_ms"] for m in ("whole", "streamed") if (m, 64) in mock]
    print(f"goal_streams_held_512_no_refusal: held {held[0]}, refused {held[1]}")
    if kept:
        print(f"goal_throughput_kept_64_256_min (>= 0.95): {min(kept):.2f}")
    if p50:
        print(f"goal_added_p50_ms_at_64_max (<= 2): {max(p50):.2f}")
        print(f"goal_added_p99_ms_at_64_max (<= 10): {max(p99):.2f}")
    print(f"goal_real_vllm_added_p50_ms_at_1 (<= 3): {real_c1:.2f}")
    print(f"mean_of_levels_throughput_kept: {statistics.mean(kept) if kept else float('nan'):.2f}")


def run_sweeps(
    *,
    db_url: str,
    extra_env: dict[str, str],
    vllm_url: str,
    api_port: int,
    api_pid: int,
    direct_bodies: list[dict],
    strop_bodies: list[dict],
    headers: dict,
    real_c1_added_ms: float,
    levels: tuple[int, ...],
    token_delay_ms: float,
    max_tokens: int,
    hold: int,
    hold_tokens: int = 100,
    real: bool = True,
) -> None:
    """The real vLLM's sweep on the caller's API (``api_port``, ``api_pid``), unless ``real`` is
    False, then the mock's, on one API process of its own on the same database."""
    import subprocess
    import sys

    from common import free_port, start_gunicorn, stop, wait_healthy

    def pick(bodies: list[dict]) -> Callable[[int], dict]:
        return lambda i: {k: v for k, v in bodies[i % len(bodies)].items() if k != "stream"}

    def with_usage(body: Callable[[int], dict]) -> Callable[[int], dict]:
        return lambda i: {**body(i), "stream_options": {"include_usage": True}}

    if real:
        run_loop(
            sweep(
                "real",
                direct=(f"{vllm_url}/v1/completions", with_usage(pick(direct_bodies)), {}),
                strop=(f"http://127.0.0.1:{api_port}/v1/completions", pick(strop_bodies), headers),
                api_pid=api_pid,
                levels=levels,
                requests=lambda c: max(32, c),
            )
        )
    mock_port, mock_api_port = free_port(), free_port()
    mock = subprocess.Popen(
        [sys.executable, "benchmarks/mock_vllm.py", "--port", str(mock_port), "--token-delay-ms", str(token_delay_ms)],
        start_new_session=True,
    )
    api = None
    try:
        mock_url = f"http://127.0.0.1:{mock_port}"
        wait_healthy(f"{mock_url}/health", mock, 60, "the mock vLLM")
        env = {**extra_env, "VLLM_BASE_URLS": mock_url, "STROP_SERVING_MAX_STREAMS_PER_TENANT": "0"}
        api = start_gunicorn(db_url, mock_api_port, 1, **env)
        sized = [{**b, "max_tokens": max_tokens} for b in strop_bodies]
        direct_sized = [{**b, "max_tokens": max_tokens} for b in direct_bodies]
        figures = run_loop(
            sweep(
                "mock",
                direct=(f"{mock_url}/v1/completions", with_usage(pick(direct_sized)), {}),
                strop=(f"http://127.0.0.1:{mock_api_port}/v1/completions", pick(sized), headers),
                api_pid=api.pid,
                levels=levels,
                upstream_pid=mock.pid,
            )
        )
        print(f"mock_machine_cores: {os.cpu_count()}")
        # A stream must outlast the time the API takes to start them all, or the first end before
        # the last begin: at 100 tokens (5 s at 50 ms), what is held is the start rate times 5 s.
        long = {**sized[0], "max_tokens": max(max_tokens, hold_tokens)}
        held = run_loop(hold_streams(f"http://127.0.0.1:{mock_api_port}/v1/completions", long, headers, hold))
        print(f"mock_hold_streams_held: {held[0]}")
        print(f"mock_hold_refusals: {held[1]}")
        print(
            f"mock_setup: one API process (1 uvicorn worker), {token_delay_ms:.0f} ms a token, "
            f"{max_tokens} tokens a completion; hold: {hold} streams of {long['max_tokens']} tokens"
        )
        print_goals(figures, held, real_c1_added_ms)
    finally:
        if api is not None:
            stop(api)
        stop(mock)


def main() -> None:
    """The mock upstream's sweep and hold alone (no vLLM, minutes instead of the whole
    ``make bench-serving``): ``python benchmarks/serving_sweep.py [--levels 64,256] [--hold 512]``."""
    import argparse
    import importlib
    import math

    from common import DEFAULT_DATABASE_URL, fresh_database
    from serving import bench_adapter, prompts_from_stdlib  # and the checkout on sys.path

    starter = importlib.import_module("model_supply.starter")

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--levels", default="1,16,64,256", help="the sweep's concurrencies (empty: the hold alone)")
    parser.add_argument("--token-delay-ms", type=float, default=50.0)
    parser.add_argument("--max-tokens", type=int, default=20)
    parser.add_argument("--hold", type=int, default=512, help="streams opened at once on one API process")
    parser.add_argument("--hold-tokens", type=int, default=100, help="tokens in each held stream")
    args = parser.parse_args()
    db_url = fresh_database(args.database_url, "strop_bench_serving_mock")
    key, _, _ = bench_adapter(starter.ensure_starter_model("tiny"), db_url)  # the mock answers any model
    prompts = prompts_from_stdlib(160)
    common = {"temperature": 0.0, "seed": 1}
    direct = {"model": "base", "logprobs": 1, "return_token_ids": True, **common}
    run_sweeps(
        db_url=db_url,
        extra_env={},
        vllm_url="",
        api_port=0,
        api_pid=0,
        direct_bodies=[{"prompt": p, **direct} for p in prompts],
        strop_bodies=[{"prompt": p, "user": f"dev-{i % 20}", **common} for i, p in enumerate(prompts)],
        headers={"Authorization": f"Bearer {key}"},
        real_c1_added_ms=math.nan,
        levels=tuple(int(c) for c in args.levels.split(",") if c),
        token_delay_ms=args.token_delay_ms,
        max_tokens=args.max_tokens,
        hold=args.hold,
        hold_tokens=args.hold_tokens,
        real=False,
    )


if __name__ == "__main__":
    main()
