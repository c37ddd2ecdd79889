"""The world ``benchmarks/data.py`` times: a year of interactions with feedback for each tenant,
loaded by ``COPY`` oldest first, and the big tenant's running experiment with its exposed users
(:func:`build`), or the world a previous run loaded (:func:`loaded`, ``--reuse``)."""

from __future__ import annotations

import argparse
import random
import time
from datetime import timedelta

DAYS = 365
DEVELOPERS = 200
VOCABULARY = 49_152
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
    from apps.interactions.ids import time_id
    from apps.interactions.packed import pack_floats, pack_ids

    # Token ids as a 49,152-token vocabulary draws them (SmolLM2's), not small integers: their size
    # as stored depends on it. A few dozen distinct prompts keep the load fast.
    prompts = [pack_ids([rng.randrange(VOCABULARY) for _ in range(300)]) for _ in range(64)]
    completions = [
        (
            pack_ids([rng.randrange(VOCABULARY) for _ in range(12)]),
            pack_floats([-rng.expovariate(2) for _ in range(12)]),
        )
        for _ in range(64)
    ]
    ages = sorted((rng.uniform(0, DAYS * 86400) for _ in range(count)), reverse=True)
    for start in range(0, count, CHUNK):
        interactions, feedback = [], []
        for age in ages[start : start + CHUNK]:
            served = now - timedelta(seconds=age)
            pk = time_id(served)  # as ingest makes them (apps.interactions.ids)
            user = f"dev-{rng.randrange(DEVELOPERS):03d}"
            arm, exp_id, version_id = "", None, version.pk
            if experiment is not None and served > now - timedelta(days=3) and rng.random() < 0.5:
                user = exposed[rng.randrange(len(exposed))]
                arm = exposed_arm(user)
                exp_id = experiment.pk
                version_id = experiment.candidate_version_id if arm == "candidate" else version.pk
            interactions.append(
                (
                    pk, tenant.pk, "served", "", PREFIX, SUFFIX, rng.choice(COMPLETIONS), rng.choice(prompts),
                    *rng.choice(completions), adapter.name, adapter.pk, version_id, exp_id, arm, user, True, served,
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
