"""Dashboard page render times: p50 / p95 over ``--requests`` requests of every page, with the
experiment page holding an experiment of ``--exposures`` exposed users (100,000 by default).

The data is bulk-created in a fresh Postgres database (``--db-name``): end users with their
consent history over 30 days, their exposures, two served interactions each with feedback, one
real snapshot (``experiment_snapshot_take``) and ``--snapshots`` earlier snapshots for the
lift-over-time chart. Pages are rendered by Django's test client in this process (the whole
request: middleware, sign-in session, queries, templates, SVG charts), signed in as the owner.

    python benchmarks/dashboard.py --exposures 100000 --requests 30
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import timedelta

from common import DEFAULT_DATABASE_URL, ROOT, fresh_database, percentile, setup_django

sys.path.insert(0, str(ROOT))

BATCH = 5000


def build(exposures: int, snapshots: int, seed: int) -> dict[str, object]:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from apps.adapters.models import Adapter, AdapterVersion, BaseModel
    from apps.cohorts.models import ConsentChange, EndUser
    from apps.experiments.models import Experiment, ExperimentExposure, ExperimentSnapshot
    from apps.experiments.services import experiment_snapshot_take
    from apps.interactions.ids import time_id
    from apps.interactions.models import Feedback, Interaction
    from apps.tenants.services import membership_create, tenant_create

    rng = random.Random(seed)
    now = timezone.now()
    tenant = tenant_create(name="Bench", slug="bench")
    base = BaseModel.objects.create(name="bench-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    control = AdapterVersion.objects.create(
        tenant=tenant, adapter=adapter, number=1, artifact_path="/nonexistent/v1", vllm_name="bench--tab--v1",
        status="production",
    )  # fmt: skip
    candidate = AdapterVersion.objects.create(
        tenant=tenant, adapter=adapter, number=2, parent=control, artifact_path="/nonexistent/v2",
        vllm_name="bench--tab--v2", status="in_experiment",
    )  # fmt: skip
    Adapter.objects.filter(pk=adapter.pk).update(production_version=control)
    experiment = Experiment.objects.create(
        tenant=tenant, adapter=adapter, control_version=control, candidate_version=candidate, salt="bench",
        status="running", started_at=now - timedelta(days=3), created_by="bench",
        config={"min_users_per_arm": 100},
    )  # fmt: skip
    started = time.perf_counter()
    for start in range(0, exposures, BATCH):
        chunk = range(start, min(exposures, start + BATCH))
        users = EndUser.objects.bulk_create(
            [EndUser(tenant=tenant, external_id=f"user-{n:06d}", opted_in=True, opted_in_changed_at=now) for n in chunk]
        )
        ConsentChange.objects.bulk_create(
            [
                ConsentChange(
                    tenant=tenant, end_user=u, opted_in=True, source="import", actor="bench",
                    changed_at=now - timedelta(days=rng.uniform(0, 30)),
                )
                for u in users
            ]
        )  # fmt: skip
        arms = {u.pk: "candidate" if rng.random() < 0.5 else "control" for u in users}
        ExperimentExposure.objects.bulk_create(
            [
                ExperimentExposure(
                    tenant=tenant, experiment=experiment, end_user=u, arm=arms[u.pk],
                    first_exposed_at=now - timedelta(hours=rng.uniform(0, 72)),
                )
                for u in users
            ]
        )  # fmt: skip
        interactions = []
        for u in users:
            arm = arms[u.pk]
            for _ in range(2):
                served = now - timedelta(hours=rng.uniform(0, 72))
                interactions.append(
                    Interaction(
                        id=time_id(served), tenant=tenant, source="served", prompt="def f(x):\n    ",
                        completion="return x" if rng.random() < 0.9 else "", adapter=adapter,
                        adapter_version=candidate if arm == "candidate" else control, experiment=experiment,
                        experiment_arm=arm, end_user_id=u.external_id, end_user_opted_in=True, served_at=served,
                        received_at=served, latency_ms=rng.uniform(20, 200),
                    )
                )  # fmt: skip
        Interaction.objects.bulk_create(interactions)
        accept = {"control": 0.30, "candidate": 0.34}
        Feedback.objects.bulk_create(
            [
                Feedback(
                    tenant=tenant, interaction=i,
                    outcome="accepted" if rng.random() < accept[i.experiment_arm] else rng.choice(
                        ("rejected", "not_shown")),
                    occurred_at=i.served_at, received_at=i.served_at, updated_at=i.served_at,
                )
                for i in interactions
            ]
        )  # fmt: skip
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    snapshot = experiment_snapshot_take(experiment.pk)
    snapshot_s = time.perf_counter() - started
    assert snapshot is not None and snapshot.users == exposures
    # Earlier looks for the lift-over-time chart: the real analysis, its lift and band scaled as
    # a shrinking interval would be (the page's cost is in reading them, not in their values).
    history = []
    for k in range(snapshots):
        analysis = {**snapshot.analysis, "metrics": [dict(m) for m in snapshot.analysis["metrics"]]}
        widen = 1 + 3 * (snapshots - k) / snapshots
        for m in analysis["metrics"]:
            band = (m.get("ci_always_valid") or {}).get("abs")
            if band and m.get("abs_lift") is not None:
                half = (band[1] - band[0]) / 2 * widen
                m["ci_always_valid"] = {"abs": [m["abs_lift"] - half, m["abs_lift"] + half]}
        history.append(
            ExperimentSnapshot(
                experiment=experiment, computed_at=now - timedelta(minutes=snapshots - k), users=snapshot.users,
                action=snapshot.action, analysis=analysis, seconds=snapshot.seconds,
            )
        )  # fmt: skip
    ExperimentSnapshot.objects.bulk_create(history)
    owner = get_user_model().objects.create_user(username="bench-owner", password="bench-password-123")
    membership_create(tenant, user=owner, role="owner")
    return {
        "tenant": tenant, "adapter": adapter, "experiment": experiment, "owner": owner, "build_s": build_s,
        "snapshot_s": snapshot_s, "control": control,
    }  # fmt: skip


def pages(world: dict[str, object]) -> dict[str, str]:
    from django.urls import reverse

    slug = world["tenant"].slug  # type: ignore[attr-defined]
    adapter = world["adapter"].name  # type: ignore[attr-defined]
    experiment = world["experiment"].pk  # type: ignore[attr-defined]

    def url(name: str, **kwargs: object) -> str:
        return reverse(f"dashboard:{name}", kwargs={"tenant_slug": slug, **kwargs})

    return {
        "experiment": url("experiment", experiment_id=experiment),
        "experiment-live (htmx)": url("experiment-live", experiment_id=experiment),
        "experiment-promote (confirm)": url("experiment-promote", experiment_id=experiment),
        "experiments": url("experiments", adapter_name=adapter),
        "experiment-new (form)": url("experiment-new", adapter_name=adapter),
        "overview": url("adapter-overview", adapter_name=adapter),
        "overview-live (htmx)": url("overview-live", adapter_name=adapter),
        "versions": url("versions", adapter_name=adapter),
        "cohorts": url("cohorts"),
        "cohorts search": url("cohorts") + "?q=user-0999&state=in",
        "end-user": url("end-user") + "?end_user_id=user-000042",
        "end-user-erase (confirm)": url("end-user-erase") + "?end_user_id=user-000042",
        "interactions": url("interactions"),
        "runs": url("runs"),
        "keys": url("keys"),
        "audit": url("audit"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exposures", type=int, default=100_000, help="exposed users of the running experiment")
    parser.add_argument("--snapshots", type=int, default=240, help="earlier snapshots for the lift chart")
    parser.add_argument("--requests", type=int, default=30, help="requests per page")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db-name", default="strop_bench_dashboard")
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    setup_django(fresh_database(base_url, args.db_name))
    import logging

    from django.test import Client

    logging.getLogger("strop.request").setLevel(logging.WARNING)  # one log line per request would drown the table

    world = build(args.exposures, args.snapshots, args.seed)
    client = Client()
    client.force_login(world["owner"])  # type: ignore[arg-type]
    print(f"exposures: {args.exposures}")
    print(f"interactions: {2 * args.exposures}")
    print(f"snapshots: {args.snapshots + 1}")
    print(f"requests_per_page: {args.requests}")
    print(f"build_seconds: {world['build_s']:.1f}")
    print(f"snapshot_seconds: {world['snapshot_s']:.2f}  # experiment_snapshot_take on this data")
    print(f"{'page':<30} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for name, url in pages(world).items():
        response = client.get(url)  # warm: templates compiled, connection open
        assert response.status_code == 200, (name, url, response.status_code)
        timings = []
        for _ in range(args.requests):
            started = time.perf_counter()
            response = client.get(url)
            timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        print(f"{name:<30} {statistics.median(timings):>8.1f} {percentile(timings, 0.95):>8.1f} {max(timings):>8.1f}")


if __name__ == "__main__":
    main()
