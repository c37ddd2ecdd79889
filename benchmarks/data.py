"""A year of data: ``--interactions`` interactions with feedback over 12 months for ``--tenants``
tenants (the first holds half, the second 100,000 for the export comparison, the rest share what is
left), loaded by ``COPY``, plus a running experiment of ``--exposures`` exposed users in the big
tenant. Then it times, signed in as the big tenant's owner:

* every dashboard page (p50 / p95 over ``--requests`` requests; goal p95 <= 300 ms), and the API's
  list of end users (first page, a page deep in by cursor, searches, and a deep offset to compare);
* the experiment snapshot (goal <= 5 s at 1 million exposures);
* a training window's export for the big tenant and for the 100,000-row tenant (goal: within 20 %);
* an end user's erase in the big tenant (goal <= 2 s);
* a retention pass dropping the oldest month of the big tenant while ingest runs beside it (goal
  <= 10 s, and every acknowledged interaction still there);
* bytes per interaction on disk, with its feedback and every index.

    python benchmarks/data.py --interactions 1000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from urllib.parse import urlencode, urlparse

from common import DEFAULT_DATABASE_URL, ROOT, fresh_database, percentile, setup_django
from data_load import DEVELOPERS, PREFIX, build, loaded

sys.path.insert(0, str(ROOT))


def _still_there(tenant) -> str:  # type: ignore[no-untyped-def]
    from apps.cohorts.models import EndUser

    names = set(
        EndUser.objects.filter(tenant=tenant, external_id__startswith="dev-").values_list("external_id", flat=True)
    )
    return next(f"dev-{n:03d}" for n in range(7, DEVELOPERS) if f"dev-{n:03d}" in names)


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _adapter_of(tenant):  # type: ignore[no-untyped-def]
    from apps.adapters.models import Adapter

    return Adapter.objects.get(tenant=tenant, name="tab")


def export_seconds(tenant, adapter, max_events: int) -> float:  # type: ignore[no-untyped-def]
    from apps.training.dataset import dataset_export
    from apps.training.models import TrainingRun
    from apps.training.selectors import training_policy_get

    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, status="exporting")
    policy = training_policy_get(adapter)
    seconds = _time(lambda: dataset_export(run, policy=policy, max_events=max_events))
    TrainingRun.objects.filter(pk=run.pk).update(status="failed")
    return seconds


def retention_with_ingest(tenant) -> tuple[float, int, int, int]:  # type: ignore[no-untyped-def]
    """A pass that drops the oldest month while another thread ingests; (seconds, deleted, acked, missing)."""
    from django.db import connection
    from django.utils import timezone

    from apps.interactions.models import Interaction
    from apps.interactions.services import interactions_ingest
    from apps.privacy.retention import retention_prune

    acked: list[str] = []
    stop = threading.Event()

    def ingest() -> None:
        n, run = 0, uuid.uuid4().hex[:8]  # ids of their own: a --reuse run's are not duplicates of the last one's
        while not stop.is_set():
            items = [
                {"client_id": f"live-{run}-{n}-{i}", "prefix": PREFIX, "completion": "return 1", "model": "tab",
                 "end_user_id": "dev-001", "opted_in": True}
                for i in range(50)
            ]  # fmt: skip
            acked.extend(r.id for r in interactions_ingest(tenant, items=items) if r.status == "created")
            n += 1
        connection.close()

    worker = threading.Thread(target=ingest)
    worker.start()
    time.sleep(1)
    oldest = Interaction.objects.filter(tenant=tenant).order_by("served_at").values_list("served_at", flat=True)[0]
    tenant.retention_days = (timezone.now() - oldest).days - 30  # the oldest month still there (--reuse)
    tenant.save(update_fields=["retention_days"])
    started = time.perf_counter()
    report = retention_prune(tenant)
    seconds = time.perf_counter() - started
    stop.set()
    worker.join()
    present = Interaction.objects.filter(tenant=tenant, id__in=acked).count()
    return seconds, report.deleted["interactions"], len(acked), len(acked) - present


def storage() -> dict[str, float]:
    from django.db import connection

    with connection.cursor() as cursor:
        sizes = {}
        for table in ("interactions_interaction", "interactions_feedback", "interactions_interactionrollup"):
            cursor.execute("SELECT pg_total_relation_size(%s), pg_relation_size(%s)", [table, table])
            sizes[table] = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM interactions_interaction")
        count = cursor.fetchone()[0]
    interactions, feedback = sizes["interactions_interaction"], sizes["interactions_feedback"]
    return {
        "interactions": count,
        "bytes_per_interaction_with_indexes": interactions[0] / count,
        "bytes_per_interaction_heap_only": interactions[1] / count,
        "bytes_per_interaction_with_feedback_and_indexes": (interactions[0] + feedback[0]) / count,
        "rollup_bytes_total": sizes["interactions_interactionrollup"][0],
    }


def _time_page(client, name: str, url: str, requests: int) -> None:  # type: ignore[no-untyped-def]
    response = client.get(url)
    assert response.status_code == 200, (name, url, response.status_code)
    timings = []
    for _ in range(requests):
        started = time.perf_counter()
        assert client.get(url).status_code == 200
        timings.append((time.perf_counter() - started) * 1000)
    print(f"{name:<30} {statistics.median(timings):>8.1f} {percentile(timings, 0.95):>8.1f} {max(timings):>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interactions", type=int, default=1_000_000, help="the issue's size is 10,000,000")
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--exposures", type=int, default=100_000, help="exposed users of the running experiment")
    parser.add_argument("--requests", type=int, default=30, help="requests per page")
    parser.add_argument("--window", type=int, default=4096, help="events in the exported training window")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db-name", default="strop_bench_data")  # dropped and made afresh
    parser.add_argument("--reuse", action="store_true", help="time the database a previous run loaded (no load)")
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    if args.reuse:
        setup_django(urlparse(base_url)._replace(path=f"/{args.db_name}").geturl())
    else:
        setup_django(fresh_database(base_url, args.db_name))
    import logging

    from dashboard import pages
    from django.test import Client
    from django.urls import reverse

    from apps.common.parsing import cursor_encode
    from apps.dashboard.selectors import InteractionFilters, interaction_page, interaction_search
    from apps.experiments.services import experiment_snapshot_take
    from apps.privacy.services import end_user_erase
    from apps.tenants.services import api_key_create

    logging.getLogger("strop.request").setLevel(logging.WARNING)
    logging.getLogger("apps").setLevel(logging.WARNING)
    world = loaded(args) if args.reuse else build(args)
    print(f"interactions: {args.interactions}")
    print(f"tenants: {args.tenants}")
    print(f"exposures: {args.exposures}")
    print(f"load_seconds: {world['load_s']:.1f}  # COPY, with every index and the rollup triggers")
    print(f"rollups_build_seconds: {world['rollups_s']:.1f}  # every hour of every tenant, from raw rows")
    print(f"history_freeze_seconds: {world.get('freeze_s', 0.0):.1f}  # every exposure's pre-exposure history, once")
    for name, value in storage().items():
        print(f"{name}: {value:.0f}")
    snapshot_s = _time(lambda: experiment_snapshot_take(world["experiment"].pk))  # type: ignore[attr-defined]
    print(f"experiment_snapshot_seconds: {snapshot_s:.2f}  # goal <= 5 s at 1,000,000 exposures")
    export_seconds(world["tenants"][-1], _adapter_of(world["tenants"][-1]), 512)  # warm: the tokenizer loads once
    big = export_seconds(world["tenant"], world["adapter"], args.window)
    second = export_seconds(world["second"], world["second_adapter"], args.window)
    print(f"export_seconds_big_tenant: {big:.2f}  # {args.window} events, {args.interactions // 2} rows")
    print(f"export_seconds_100k_tenant: {second:.2f}  # goal: big within 20 % of this")
    erased = _still_there(world["tenant"])  # dev-007 on a fresh load; the next one after a --reuse run
    erase_s = _time(lambda: end_user_erase(world["tenant"], external_id=erased, actor="bench"))  # type: ignore[arg-type]
    print(f"erase_seconds: {erase_s:.2f}  # goal <= 2 s")
    # The erase marked every hour its user had interactions in; beat refreshes them (every 5 s), and
    # until then the charts read those hours from raw rows. The pages are timed as beat leaves them.
    from apps.interactions.rollups import rollups_refresh_all

    refresh_s = _time(rollups_refresh_all)
    print(f"rollups_refresh_after_erase_seconds: {refresh_s:.1f}  # beat's next passes, every marked hour")
    client = Client()
    client.force_login(world["owner"])  # type: ignore[arg-type]
    urls = pages(world)
    urls["overview (30 days)"] = urls["overview"] + "?range=30d"
    urls["overview (7 days)"] = urls["overview"] + "?range=7d"
    urls["interactions (page 2)"] = None  # type: ignore[assignment]
    urls["cohorts (page after user-500000)"] = urls["cohorts"] + "?after=user-500000"  # keyset: as cheap as the first
    urls["cohorts search (2 characters)"] = urls["cohorts"] + "?q=zz"  # the start of an id, and matches no one
    urls["settings"] = reverse("dashboard:settings", kwargs={"tenant_slug": world["tenant"].slug})  # type: ignore[attr-defined]
    print(f"{'page':<30} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for name, url in urls.items():
        if url is None:  # the second keyset page
            first = interaction_page(
                interaction_search(world["tenant"], filters=InteractionFilters()), after=None, per_page=50
            )  # type: ignore[arg-type]
            url = f"{urls['interactions']}?{urlencode({'after': first.older})}"
        _time_page(client, name, url, args.requests)
    # The API's list of end users (an ingest key): a page deep in by cursor costs what the first does.
    key = api_key_create(world["tenant"], name="bench-users", scopes=["ingest"]).raw_key  # type: ignore[arg-type]
    middle = cursor_encode(f"user-{args.exposures // 2:06d}")
    api_urls = {
        "GET /v1/users (capped counts)": "/v1/users?exact_counts=false",
        "GET /v1/users (exact counts)": "/v1/users",  # a page by offset counts exactly by default
        "GET /v1/users (cursor, middle)": f"/v1/users?cursor={middle}",
        "GET /v1/users?search=user-0999": "/v1/users?search=user-0999&opted_in=true&exact_counts=false",
        "GET /v1/users?search=zz": "/v1/users?search=zz&exact_counts=false",  # an id's start; matches no one
        "GET /v1/users?offset=50000": "/v1/users?offset=50000&exact_counts=false",  # the older clients' way
    }
    for name, url in api_urls.items():
        _time_page(Client(HTTP_AUTHORIZATION=f"Bearer {key}"), name, url, args.requests)
    seconds, deleted, acked, missing = retention_with_ingest(world["tenant"])
    print(f"retention_pass_seconds: {seconds:.2f}  # dropped {deleted} interactions (a month); goal <= 10 s")
    print(f"retention_ingest_acknowledged: {acked}")
    print(f"retention_ingest_missing: {missing}  # must be 0")


if __name__ == "__main__":
    main()
