"""Ingestion benchmark: the batch API against the raw COPY ceiling on this machine.

Starts the API under gunicorn on a fresh Postgres database and, in one run, measures
  (a) raw psycopg COPY of the same rows into the same table, in the same batches (the ceiling),
  (b) events/s through POST /v1/interactions with concurrent clients, in rounds alternating with
      (a) (each a share of the batches), so both see the same load and table size,
  (c) single POST /v1/feedback requests/s with p50/p99 latency (a Celery worker takes the training
      checks they ask for, as in production), and
  (d) the same bodies to a bare Django view in the same gunicorn running the same upsert once
      (benchmarks/bare_urls.py), in alternating rounds: (c)/(d) is what Strop's checks cost,
then counts rows to prove nothing was lost or duplicated. Prints one line per figure.

    make bench-ingest            # or: python benchmarks/ingest.py --events 50000 --clients 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import orjson
import psycopg
from common import (
    DEFAULT_DATABASE_URL,
    django_env,
    fresh_database,
    manage,
    percentile,
    setup_django,
    start_gunicorn,
    stop,
)


def event(n: int, run: str) -> dict:
    return {
        "client_id": f"{run}-{n}",
        "prefix": ("    def handle(self, request):\n        payload = request.json()\n" * 8)[:600],
        "suffix": "\n        return Response(status=204)\n" * 4,
        "completion": f"result = self.service.process(payload, attempt={n % 7})",
        "completion_token_ids": [(n * 31 + i) % 50000 for i in range(20)],
        "completion_logprobs": [-0.05 * (i % 9) for i in range(20)],
        "model": "starter-small",
        "end_user_id": f"user-{n % 500}",
        "opted_in": n % 2 == 0,
        "served_at": "2026-11-21T10:00:00Z",
        "latency_ms": 40.0 + n % 30,
        "metadata": {"language": "python", "editor": "vscode"},
    }


def setup_database(base_url: str, dbname: str) -> tuple[str, str]:
    db_url = fresh_database(base_url, dbname)
    key = manage("tenant_create", "Bench", "--rate-limit", "100000000", "--key-only", db_url=db_url)
    return db_url, key


def copy_ceiling(conn: psycopg.Connection, rows: list[tuple], columns: tuple[str, ...], batch: int) -> float:
    """COPY the same rows, in the API's batch size, into the interactions table itself (its
    indexes, unique constraint, foreign keys and rollup triggers), one transaction per batch;
    returns the seconds it took. ``ceiling_remove`` takes them out again."""
    start = time.perf_counter()
    for offset in range(0, len(rows), batch):
        with conn.cursor() as cur:
            with cur.copy(f"COPY interactions_interaction ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows[offset : offset + batch]:
                    copy.write_row(row)
        conn.commit()
    return time.perf_counter() - start


def ceiling_remove(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM interactions_interaction WHERE client_id LIKE 'ceil-%'")
        conn.execute("VACUUM ANALYZE interactions_interaction")


def _post_all(args: tuple[str, str, str, int, list[bytes]]) -> list[float]:
    """One client process: POST every body in turn, fail loudly on any unexpected answer."""
    base, key, path, expected_status, bodies = args
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    latencies = []
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        for body in bodies:
            start = time.perf_counter()
            response = client.post(path, content=body)
            latencies.append(time.perf_counter() - start)
            rejected = expected_status == 207 and response.json()["rejected"]
            if response.status_code != expected_status or rejected:
                raise RuntimeError(f"{path} failed: {response.status_code} {response.text[:300]}")
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--feedback", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of (a) and (b), of (c) and (d)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--db-name", default="strop_bench", help="the fresh database it makes (dropped first)")
    args = parser.parse_args()

    db_url, key = setup_database(args.database_url, args.db_name)
    run = uuid.uuid4().hex[:8]
    events = [event(n, run) for n in range(args.events)]

    # (a) the ceiling's rows: the same rows as the API writes them, to go straight into Postgres.
    setup_django(db_url)
    from django.utils import timezone

    from apps.interactions.ids import time_id
    from apps.interactions.rows import INTERACTION_COLUMNS
    from apps.interactions.services.ingest import _interaction_row
    from apps.interactions.validation import interaction_validate
    from apps.tenants.models import Tenant

    tenant = Tenant.objects.get(slug="bench")
    now = timezone.now()
    ceiling_rows = [  # per batch
        [
            _interaction_row(
                tenant,
                interaction_validate({**e, "client_id": "ceil-" + e["client_id"]}),
                new_id=time_id(now),  # as ingest makes them
                source="logged",
                now=now,
                opted_in=e["opted_in"],
                experiment=None,
            )
            for e in events[i : i + args.batch]
        ]
        for i in range(0, len(events), args.batch)
    ]

    base = f"http://127.0.0.1:{args.port}"
    # Feedback asks for a training check; a worker takes it and clears the debounce, as in production.
    from config.celery import app
    from tests.fixtures.workers import Workers

    app.control.purge()
    workers = Workers(env=django_env(db_url), log_dir=Path(tempfile.mkdtemp(prefix="strop-bench-ingest-")))
    gunicorn = None
    try:
        workers.start("default", "default", "threads")
        gunicorn = start_gunicorn(
            db_url,
            args.port,
            args.workers,
            DJANGO_SETTINGS_MODULE="benchmarks.bare_settings",
            BENCH_BARE_TENANT_ID=str(tenant.pk),
        )
        bodies = [orjson.dumps({"items": events[i : i + args.batch]}) for i in range(0, len(events), args.batch)]
        # (a) and (b) in alternating rounds, a share of the batches each, so that both see the
        # same load on a shared machine and the same table size; the first batch warms up, untimed.
        _post_all((base, key, "/v1/interactions", 207, bodies[:1]))  # warm every import path once
        batch_latencies: list[float] = []
        copy_elapsed = api_elapsed = 0.0
        with ProcessPoolExecutor(args.clients) as pool, psycopg.connect(db_url) as ceiling:
            for r in range(args.rounds):
                part = bodies[1 + r :: args.rounds]
                rows = [row for n in range(1 + r, len(bodies), args.rounds) for row in ceiling_rows[n]]
                copy_elapsed += copy_ceiling(ceiling, rows, INTERACTION_COLUMNS, args.batch)
                shards = [(base, key, "/v1/interactions", 207, part[c :: args.clients]) for c in range(args.clients)]
                start = time.perf_counter()
                batch_latencies += [x for chunk in pool.map(_post_all, shards) for x in chunk]
                api_elapsed += time.perf_counter() - start
        del ceiling_rows
        ceiling_remove(db_url)
        timed = len(events) - args.batch  # the warm-up batch was not timed, by either
        copy_rate, api_rate = timed / copy_elapsed, timed / api_elapsed

        feedback_bodies = [
            orjson.dumps({"client_id": f"{run}-{n % args.events}", "outcome": "accepted" if n % 3 else "rejected"})
            for n in range(args.feedback)
        ]
        single: dict[str, tuple[list[float], float]] = {"/v1/feedback": ([], 0.0), "/bench/bare-feedback": ([], 0.0)}
        with ProcessPoolExecutor(args.clients) as pool:
            _post_all((base, key, "/bench/bare-feedback", 200, feedback_bodies[:1]))
            for r in range(args.rounds):
                part = feedback_bodies[r :: args.rounds]
                for path in single:
                    shards = [(base, key, path, 200, part[c :: args.clients]) for c in range(args.clients)]
                    start = time.perf_counter()
                    latencies = [x for chunk in pool.map(_post_all, shards) for x in chunk]
                    elapsed = time.perf_counter() - start
                    single[path] = (single[path][0] + latencies, single[path][1] + elapsed)
    finally:
        try:
            if gunicorn is not None:
                stop(gunicorn)
        finally:
            workers.stop_all()

    with psycopg.connect(db_url) as conn:
        rows, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT client_id) FROM interactions_interaction WHERE client_id LIKE %s",
            (f"{run}-%",),
        ).fetchone()
        feedback_rows, feedback_events = conn.execute(
            "SELECT count(*), coalesce(sum(events_received), 0) FROM interactions_feedback "
            "WHERE pending_client_id IS NULL OR pending_client_id NOT LIKE 'bare-%'"
        ).fetchone()
    expected_feedback_rows = min(args.feedback, args.events)
    lost = args.events - distinct
    duplicated = rows - distinct

    print(
        f"machine: {os.cpu_count()} cores; events {args.events}, batch {args.batch}, clients {args.clients}, "
        f"gunicorn workers {args.workers}"
    )
    print(f"(a) raw COPY ceiling:           {copy_rate:,.0f} rows/s")
    print(
        f"(b) batch API:                  {api_rate:,.0f} events/s "
        f"(batch p50 {statistics.median(batch_latencies) * 1000:.0f} ms, "
        f"p99 {percentile(batch_latencies, 0.99) * 1000:.0f} ms)"
    )
    feedback_elapsed, bare_elapsed = single["/v1/feedback"][1], single["/bench/bare-feedback"][1]
    for label, (latencies, elapsed) in (
        ("(c) single feedback:", single["/v1/feedback"]),
        ("(d) bare Django view:", single["/bench/bare-feedback"]),
    ):
        print(
            f"{label:<32}{args.feedback / elapsed:,.0f} requests/s "
            f"(p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {percentile(latencies, 0.99) * 1000:.1f} ms)"
        )
    print(f"ratio (c)/(d):                  {bare_elapsed / feedback_elapsed:.2f} (goal >= 0.8)")
    print(f"ratio (b)/(a):                  {api_rate / copy_rate:.2f} (goal >= 0.6)")
    print(f"interactions: stored {rows}, lost {lost}, duplicated {duplicated}")
    print(
        f"feedback: rows {feedback_rows} (expected {expected_feedback_rows}), events {feedback_events} "
        f"(sent {args.feedback})"
    )
    if lost or duplicated or feedback_rows != expected_feedback_rows or feedback_events != args.feedback:
        sys.exit("FAIL: rows were lost or duplicated")


if __name__ == "__main__":
    main()
