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
import random
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from urllib.parse import urlencode, urlparse

import orjson
from common import DEFAULT_DATABASE_URL, ROOT, fresh_database, percentile, setup_django

sys.path.insert(0, str(ROOT))

DAYS = 365
DEVELOPERS = 200
CHUNK = 50_000
PREFIX = (
    "import os\nimport sys\n\n\ndef load(path):\n    with open(path) as handle:\n        return handle.read()\n" * 6
)
SUFFIX = "\n\nif __name__ == '__main__':\n    main()\n" * 3
COMPLETIONS = ["return x + 1", "", "for item in items:\n        yield item", "pass", "raise ValueError(name)"]
OUTCOMES = ["accepted"] * 3 + ["rejected"] * 4 + ["not_shown"] * 2 + ["edited"]


def _sizes(total: int, tenants: int) -> list[int]:
    big, second = total // 2, min(100_000, total // 4)
    rest = total - big - second
    return [big, second] + [rest // (tenants - 2)] * (tenants - 2)


def _copy(cursor, table: str, columns: tuple[str, ...], rows) -> None:  # type: ignore[no-untyped-def]
    with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


INTERACTION_COLUMNS = (
    "id", "tenant_id", "source", "prompt", "prefix", "suffix", "completion", "prompt_token_ids",
    "completion_token_ids", "completion_logprobs", "model_name", "adapter_id", "adapter_version_id", "experiment_id",
    "experiment_arm", "end_user_id", "end_user_opted_in", "served_at", "received_at", "latency_ms", "metadata",
    "conversation_id",
)  # fmt: skip
FEEDBACK_COLUMNS = (
    "tenant_id", "interaction_id", "outcome", "reward_weight", "kept_text", "occurred_at", "received_at",
    "updated_at", "events_received", "metadata",
)  # fmt: skip


def _load_tenant(cursor, rng, *, tenant, adapter, version, count, now, experiment=None, exposed=()):  # type: ignore[no-untyped-def]
    """``count`` interactions spread over the year (70 % with feedback), written oldest first as
    traffic arrives (a month's rows are neighbours on disk, as in production); those of the last 3
    days from an exposed user carry the experiment's arm."""
    token_ids = orjson.dumps(list(range(900, 912))).decode()
    logprobs = orjson.dumps([-0.12] * 12).decode()
    prompt_ids = orjson.dumps(list(range(300))).decode()
    ages = sorted((rng.uniform(0, DAYS * 86400) for _ in range(count)), reverse=True)
    for start in range(0, count, CHUNK):
        interactions, feedback = [], []
        for age in ages[start : start + CHUNK]:
            pk = uuid.uuid4()
            served = now - timedelta(seconds=age)
            user = f"dev-{rng.randrange(DEVELOPERS):03d}"
            arm, exp_id, version_id = "", None, version.pk
            if experiment is not None and served > now - timedelta(days=3) and rng.random() < 0.5:
                user = exposed[rng.randrange(len(exposed))]
                arm = exposed_arm(user)
                exp_id = experiment.pk
                version_id = experiment.candidate_version_id if arm == "candidate" else version.pk
            interactions.append(
                (
                    pk, tenant.pk, "served", "", PREFIX, SUFFIX, rng.choice(COMPLETIONS), prompt_ids, token_ids,
                    logprobs, adapter.name, adapter.pk, version_id, exp_id, arm, user, True, served,
                    served + timedelta(milliseconds=50), rng.uniform(20, 900), "{}", "",
                )
            )  # fmt: skip
            if rng.random() < 0.7:
                outcome = rng.choice(OUTCOMES)
                acted = served + timedelta(seconds=rng.uniform(1, 600))
                kept = "return x" if outcome == "edited" else ""
                feedback.append((tenant.pk, pk, outcome, 1.0, kept, acted, acted, acted, 1, "{}"))
        _copy(cursor, "interactions_interaction", INTERACTION_COLUMNS, interactions)
        _copy(cursor, "interactions_feedback", FEEDBACK_COLUMNS, feedback)


def exposed_arm(external_id: str) -> str:
    """user-000001 is in the candidate arm, user-000002 in the control one (the loader's SQL agrees)."""
    return "candidate" if int(external_id.rsplit("-", 1)[1]) % 2 else "control"


def _load_exposures(tenant, experiment, count: int, *, now) -> list[str]:  # type: ignore[no-untyped-def]
    """``count`` opted-in end users, each exposed to the experiment in the last 3 days, made by
    ``COPY`` (users) and one ``INSERT ... SELECT`` (exposures: they need the users' ids)."""
    from django.db import connection, transaction

    external = [f"user-{n:06d}" for n in range(count)]
    with transaction.atomic(), connection.cursor() as cursor:
        columns = ("tenant_id", "external_id", "opted_in", "opted_in_changed_at", "created_at")
        _copy(cursor.cursor, "cohorts_enduser", columns, ((tenant.pk, e, True, now, now) for e in external))
        cursor.execute(
            """
            INSERT INTO experiments_experimentexposure (tenant_id, experiment_id, end_user_id, arm, first_exposed_at)
            SELECT %s, %s, u.id,
                   CASE WHEN substring(u.external_id FROM 6)::int %% 2 = 1 THEN 'candidate' ELSE 'control' END,
                   %s - random() * interval '72 hours'
            FROM cohorts_enduser u WHERE u.tenant_id = %s AND u.external_id LIKE 'user-%%'
            """,
            [tenant.pk, experiment.pk, now, tenant.pk],
        )
    return external


def build(args: argparse.Namespace) -> dict[str, object]:
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from apps.adapters.models import Adapter, AdapterVersion, BaseModel
    from apps.cohorts.models import ConsentChange, EndUser
    from apps.experiments.models import Experiment
    from apps.interactions.rollups import rollups_refresh_all
    from apps.tenants.services import membership_create, tenant_create
    from model_supply.starter import ensure_starter_model

    rng = random.Random(args.seed)
    now = timezone.now()
    base = BaseModel.objects.create(name="bench-base", path=str(ensure_starter_model("tiny")), family="qwen")
    world: dict[str, object] = {"tenants": []}
    started = time.perf_counter()
    for index, count in enumerate(_sizes(args.interactions, args.tenants)):
        tenant = tenant_create(name=f"Tenant {index}", slug=f"t{index:02d}")
        adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
        version = AdapterVersion.objects.create(
            tenant=tenant, adapter=adapter, number=1, artifact_path=f"/nonexistent/{index}/v1",
            vllm_name=f"t{index:02d}--tab--v1", status="production",
        )  # fmt: skip
        Adapter.objects.filter(pk=adapter.pk).update(production_version=version)
        developers = [f"dev-{n:03d}" for n in range(DEVELOPERS)]
        users = EndUser.objects.bulk_create(
            [EndUser(tenant=tenant, external_id=d, opted_in=True, opted_in_changed_at=now) for d in developers]
        )
        ConsentChange.objects.bulk_create(
            [ConsentChange(tenant=tenant, end_user=u, opted_in=True, source="import", actor="bench",
                           changed_at=now - timedelta(days=DAYS + 1)) for u in users]
        )  # fmt: skip
        experiment, exposed = None, []
        if index == 0:
            candidate = AdapterVersion.objects.create(
                tenant=tenant, adapter=adapter, number=2, parent=version, artifact_path="/nonexistent/0/v2",
                vllm_name="t00--tab--v2", status="in_experiment",
            )  # fmt: skip
            experiment = Experiment.objects.create(
                tenant=tenant, adapter=adapter, control_version=version, candidate_version=candidate, salt="bench",
                status="running", started_at=now - timedelta(days=3), created_by="bench",
                config={"min_users_per_arm": 100},
            )  # fmt: skip
            exposed = _load_exposures(tenant, experiment, args.exposures, now=now)
            world.update(tenant=tenant, adapter=adapter, experiment=experiment, version=version)
        if index == 1:
            world.update(second=tenant, second_adapter=adapter)
        with transaction.atomic(), connection.cursor() as cursor:
            _load_tenant(
                cursor.cursor, rng, tenant=tenant, adapter=adapter, version=version, count=count, now=now,
                experiment=experiment, exposed=exposed,
            )  # fmt: skip
        world["tenants"].append(tenant)  # type: ignore[attr-defined]
        print(f"loaded: {tenant.slug} {count} interactions ({time.perf_counter() - started:.0f} s)", flush=True)
    world["load_s"] = time.perf_counter() - started
    from apps.experiments.history import history_freeze

    started = time.perf_counter()  # serving freezes each exposure's history as it happens; a load does it at once
    history_freeze(world["experiment"])  # type: ignore[arg-type]
    world["freeze_s"] = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    started = time.perf_counter()
    rollups_refresh_all()
    world["rollups_s"] = time.perf_counter() - started
    owner = get_user_model().objects.create_user(username="bench-owner", password="bench-password-123")
    membership_create(world["tenant"], user=owner, role="owner")  # type: ignore[arg-type]
    world["owner"] = owner
    return world


def loaded(args: argparse.Namespace) -> dict[str, object]:
    """The world a previous run loaded (``--reuse``): its load and rollup times are not measured again."""
    from django.contrib.auth import get_user_model

    from apps.adapters.models import Adapter
    from apps.experiments.models import Experiment
    from apps.tenants.models import Tenant

    tenants = list(Tenant.objects.filter(slug__startswith="t").order_by("slug"))
    experiment = Experiment.objects.get(tenant=tenants[0], status="running")
    return {
        "tenants": tenants, "tenant": tenants[0], "adapter": Adapter.objects.get(tenant=tenants[0], name="tab"),
        "experiment": experiment, "version": experiment.control_version, "second": tenants[1],
        "second_adapter": Adapter.objects.get(tenant=tenants[1], name="tab"), "load_s": 0.0, "rollups_s": 0.0,
        "owner": get_user_model().objects.get(username="bench-owner"),
    }  # fmt: skip


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
