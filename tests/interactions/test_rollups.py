"""Rollups agree with the raw rows, whatever order, repetition or lateness feedback comes in."""

from __future__ import annotations

import importlib
import random
from collections import Counter, defaultdict
from datetime import UTC, timedelta

import pytest
from django.apps import apps as django_apps
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.experiments.models import Experiment
from apps.interactions.models import LATENCY_BOUNDS_MS, Feedback, Interaction, InteractionRollup, RollupDirty
from apps.interactions.rollups import MARK_CHUNK, rollups_refresh
from apps.interactions.services import feedback_attach_pending, feedback_ingest, interactions_ingest
from apps.privacy.retention import retention_prune

pytestmark = pytest.mark.django_db

OUTCOMES = ["accepted", "rejected", "edited", "not_shown", "thumbs_up"]
PLAIN_OUTCOMES = [o for o in OUTCOMES if o != "edited"]  # an edit needs its kept text


def _raw(tenant) -> dict[tuple, Counter]:
    """The raw aggregation the rollups must equal: per (hour, model, version, arm, outcome)."""
    totals: dict[tuple, Counter] = defaultdict(Counter)
    feedback = {f.interaction_id: f for f in Feedback.objects.filter(tenant=tenant, interaction__isnull=False)}
    for row in Interaction.objects.filter(tenant=tenant):
        fb = feedback.get(row.id)
        hour = row.served_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        name = row.model_name if row.adapter_id is None else ""
        key = (hour, row.adapter_id, name, row.adapter_version_id, row.experiment_arm, fb.outcome if fb else "")
        totals[key]["requests"] += 1
        totals[key]["suggestions"] += 1 if row.completion else 0
        totals[key]["reward_weight"] += round(fb.reward_weight, 6) if fb else 0
        totals[key]["latency_count"] += 1 if row.latency_ms is not None else 0
    return totals


def _rolled(tenant, period: str = "hour") -> dict[tuple, Counter]:
    totals: dict[tuple, Counter] = defaultdict(Counter)
    for r in InteractionRollup.objects.filter(tenant=tenant, period=period):
        key = (r.bucket_start, r.adapter_id, r.model_name, r.adapter_version_id, r.experiment_arm, r.outcome)
        totals[key]["requests"] += r.requests
        totals[key]["suggestions"] += r.suggestions
        totals[key]["reward_weight"] += round(r.reward_weight, 6)
        totals[key]["latency_count"] += r.latency_count
        assert sum(r.latency_buckets) == r.latency_count and len(r.latency_buckets) == len(LATENCY_BOUNDS_MS) + 1
    return {k: +v for k, v in totals.items() if +v or v["requests"]}


def _by_day(totals: dict[tuple, Counter]) -> dict[tuple, Counter]:
    days: dict[tuple, Counter] = defaultdict(Counter)
    for key, counts in totals.items():
        days[(key[0].replace(hour=0), *key[1:])].update(counts)
    return dict(days)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rollups_agree_with_raw_rows_under_late_twice_pending_and_replayed_feedback(make_tenant, seed):
    rng = random.Random(seed)
    tenant = make_tenant(f"roll-{seed}")
    now = timezone.now()
    sent: list[dict] = []
    for step in range(6):
        items = []
        for n in range(rng.randint(5, 25)):
            served = now - timedelta(hours=rng.randint(0, 60), minutes=rng.randint(0, 59))
            item = {
                "client_id": f"c-{step}-{n}",
                "prefix": "def f():\n    ",
                "completion": rng.choice(["return 1", "", "pass"]),
                "model": rng.choice(["", "chat"]),
                "end_user_id": f"u-{rng.randint(0, 4)}",
                "served_at": served.isoformat(),
                "latency_ms": rng.choice([None, 30, 120, 700, 9000]),
            }
            if rng.random() < 0.3:
                item.update(conversation_id=f"s-{step}-{n % 3}", messages=[{"role": "user", "content": "hi"}])
            items.append(item)
        # Feedback that comes before its interaction waits as pending, then is attached.
        early = [{"client_id": i["client_id"], "outcome": rng.choice(OUTCOMES)} for i in items if rng.random() < 0.2]
        if early:
            feedback_ingest(tenant, items=early)
        interactions_ingest(tenant, items=items)
        sent.extend(items)
        if rng.random() < 0.5:
            interactions_ingest(tenant, items=items)  # a replayed batch stores nothing new
        # Feedback on earlier batches too (late), some twice, some replayed with an older time.
        feedback = []
        for item in rng.sample(sent, k=min(len(sent), rng.randint(3, 20))):
            event = {"client_id": item["client_id"], "outcome": rng.choice(OUTCOMES)}
            event["occurred_at"] = (now - timedelta(minutes=rng.randint(0, 30))).isoformat()
            feedback.append(event)
            if rng.random() < 0.3:
                feedback.append(dict(event, outcome=rng.choice(OUTCOMES)))
        for conversation in {i["conversation_id"] for i in items if "conversation_id" in i}:
            if rng.random() < 0.5:
                feedback.append({"conversation_id": conversation, "turn": 2, "outcome": "thumbs_down", "discount": 0.5})
        feedback_ingest(tenant, items=feedback)
        if rng.random() < 0.5:
            feedback_ingest(tenant, items=feedback)  # replayed
        if rng.random() < 0.6:
            rollups_refresh(tenant.pk)
    feedback_attach_pending(tenant)
    rollups_refresh(tenant.pk)
    assert not RollupDirty.objects.filter(tenant_id=tenant.pk).exists()
    raw = _raw(tenant)
    assert _rolled(tenant) == {k: +v for k, v in raw.items() if +v or v["requests"]}
    assert _rolled(tenant, "day") == _by_day(_rolled(tenant))
    # The rebuild from raw rows gives the same rollups.
    call_command("rollups_rebuild", tenant=tenant.slug)
    assert _rolled(tenant) == {k: +v for k, v in raw.items() if +v or v["requests"]}


def test_an_erased_interaction_leaves_its_hour_when_it_is_next_refreshed(tenant):
    results = interactions_ingest(tenant, items=[{"client_id": "x", "prefix": "a", "completion": "b"}])
    feedback_ingest(tenant, items=[{"client_id": "x", "outcome": "accepted"}])
    rollups_refresh(tenant.pk)
    assert InteractionRollup.objects.filter(tenant=tenant, period="hour", outcome="accepted").count() == 1
    Interaction.objects.filter(pk=results[0].id).delete()
    rollups_refresh(tenant.pk)
    assert not InteractionRollup.objects.filter(tenant=tenant).exists()


def test_a_refresh_touches_no_other_tenant(make_tenant):
    a, b = make_tenant("ra"), make_tenant("rb")
    interactions_ingest(a, items=[{"client_id": "x", "prefix": "a", "completion": "b"}])
    interactions_ingest(b, items=[{"client_id": "x", "prefix": "a", "completion": "b"}])
    rollups_refresh(a.pk)
    assert InteractionRollup.objects.filter(tenant=a).exists()
    assert not InteractionRollup.objects.filter(tenant=b).exists()
    assert RollupDirty.objects.filter(tenant_id=b.pk).exists()


def _hour_ago(hours: int):
    return (timezone.now() - timedelta(hours=hours)).astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def test_marks_beyond_one_chunk_are_taken_and_deleted_chunk_by_chunk(tenant):
    # A bulk load on the embedded SQLite writes a mark per row: one delete naming them all would pass
    # SQLite's bound-variable limit and fail at every run.
    interactions_ingest(tenant, items=[{"client_id": "x", "prefix": "a", "completion": "b"}])
    hour = _hour_ago(0)
    RollupDirty.objects.bulk_create(
        [RollupDirty(tenant_id=tenant.pk, hour=hour - timedelta(hours=n % 3)) for n in range(MARK_CHUNK * 2 + 5)]
    )
    with CaptureQueriesContext(connection) as queries:
        rollups_refresh(tenant.pk)
    assert not RollupDirty.objects.filter(tenant_id=tenant.pk).exists()
    deletes = [q["sql"] for q in queries if q["sql"].startswith('DELETE FROM "interactions_rollupdirty"')]
    assert len(deletes) >= 3 and max(sql.count(",") + 1 for sql in deletes) <= MARK_CHUNK
    assert _rolled(tenant) == _raw(tenant)


def test_far_apart_marks_recompute_the_hours_around_them_not_every_hour_between(tenant):
    early, late = _hour_ago(3000), _hour_ago(1000)
    items = [
        {
            "client_id": f"{name}-{n}",
            "prefix": "a",
            "completion": "b",
            "served_at": (at + timedelta(hours=2 * n)).isoformat(),
        }
        for name, at in (("early", early), ("late", late))
        for n in range(13)
    ]
    interactions_ingest(tenant, items=items)  # 26 separate marked hours: more ranges than MAX_RANGES
    # An hour between them with a rollup and no raw rows (its rows went after it was rolled up): a
    # recompute of it would empty it.
    between = InteractionRollup.objects.create(
        tenant_id=tenant.pk,
        period="hour",
        bucket_start=early + timedelta(hours=1000),
        requests=7,
        latency_buckets=[0] * (len(LATENCY_BOUNDS_MS) + 1),
    )
    assert rollups_refresh(tenant.pk) == 26
    assert InteractionRollup.objects.filter(pk=between.pk).exists()
    assert sum(r.requests for r in InteractionRollup.objects.filter(tenant=tenant, period="hour")) == 26 + 7


def test_the_upgrade_marks_every_hour_that_has_interactions_and_a_refresh_builds_them(tenant):
    for n, hours_ago in enumerate((500, 30, 2)):
        at = _hour_ago(hours_ago).isoformat()
        interactions_ingest(tenant, items=[{"client_id": f"u{n}", "prefix": "a", "completion": "b", "served_at": at}])
    # As on an install from before rollups: rows, and neither marks nor rollups.
    RollupDirty.objects.filter(tenant_id=tenant.pk).delete()
    migration = importlib.import_module("apps.interactions.migrations.0013_mark_existing_hours")
    with connection.cursor() as cursor:
        cursor.execute(migration.mark_sql(connection.vendor))
    assert RollupDirty.objects.filter(tenant_id=tenant.pk).count() == 3
    assert rollups_refresh(tenant.pk) == 3
    assert _rolled(tenant) == _raw(tenant)


def _plus(*totals: dict[tuple, Counter]) -> dict[tuple, Counter]:
    summed: dict[tuple, Counter] = defaultdict(Counter)
    for each in totals:
        for key, counts in each.items():
            summed[key].update(counts)
    return {k: +v for k, v in summed.items() if +v or v["requests"]}


def _minus(before: dict[tuple, Counter], after: dict[tuple, Counter]) -> dict[tuple, Counter]:
    gone: dict[tuple, Counter] = {}
    for key, counts in before.items():
        gone[key] = Counter(counts)
        gone[key].subtract(after.get(key, Counter()))
    return gone


@pytest.mark.parametrize("seed", [1, 2])
def test_rollups_stay_exact_through_retention_passes_and_late_feedback_on_the_old_rows_kept(make_tenant, seed):
    """What retention deletes stays in its hours' rollups, and an old row a running experiment keeps
    past the cutoff moves its hour's rollups when its feedback arrives late, as a recent one would."""
    rng = random.Random(seed)
    tenant = make_tenant(f"ledger-{seed}")
    base = BaseModel.objects.create(name=f"ledger-base-{seed}", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    version = AdapterVersion.objects.create(
        tenant=tenant, adapter=adapter, number=1, artifact_path="/v1", vllm_name=f"l{seed}--v1", status="in_experiment"
    )
    experiment = Experiment.objects.create(
        tenant=tenant, adapter=adapter, candidate_version=version, created_by="test", status="running", salt="s"
    )
    now = timezone.now()
    items = [
        {
            "client_id": f"c-{n}",
            "prefix": "def f():\n    ",
            "completion": rng.choice(["return 1", "", "pass"]),
            "model": "tab",
            "end_user_id": f"u-{rng.randint(0, 4)}",
            "served_at": (now - timedelta(days=rng.uniform(0, 50), minutes=rng.randint(0, 59))).isoformat(),
            "latency_ms": rng.choice([None, 30, 700, 9000]),
        }
        for n in range(120)
    ]
    interactions_ingest(tenant, items=items)
    kept = rng.sample([i["client_id"] for i in items], k=30)  # served by the running experiment: they stay
    Interaction.objects.filter(tenant=tenant, client_id__in=kept).update(experiment=experiment, experiment_arm="b")
    first = [{"client_id": c, "outcome": rng.choice(PLAIN_OUTCOMES)} for c in rng.sample(kept, k=10)]
    feedback_ingest(tenant, items=first)
    rollups_refresh(tenant.pk)
    deleted: list[dict[tuple, Counter]] = []
    for step, days in enumerate((45, 30, 20)):
        if step == 2:  # the experiment ends: its old rows, late feedback and all, go at this pass
            Experiment.objects.filter(pk=experiment.pk).update(status="stopped")
        tenant.retention_days = days
        tenant.save()
        before = _raw(tenant)
        assert retention_prune(tenant, batch=rng.choice([7, 25, 5000])).deleted["interactions"]
        deleted.append(_minus(before, _raw(tenant)))
        # Late feedback, some twice: on the old rows kept (before the cutoff now), and on recent ones.
        late = []
        for client_id in rng.sample(kept, k=12) + rng.sample([i["client_id"] for i in items], k=12):
            late.append({"client_id": client_id, "outcome": rng.choice(PLAIN_OUTCOMES)})
            if rng.random() < 0.3:
                late.append(dict(late[-1], outcome=rng.choice(PLAIN_OUTCOMES)))
        results = feedback_ingest(tenant, items=late)
        assert not [r.error for r in results if r.status == "rejected"]
        if rng.random() < 0.7:
            rollups_refresh(tenant.pk)
    rollups_refresh(tenant.pk)
    assert not RollupDirty.objects.filter(tenant_id=tenant.pk).exists()
    expected = _plus(_raw(tenant), *deleted)
    assert _rolled(tenant) == expected
    assert _rolled(tenant, "day") == _by_day(expected)
    call_command("rollups_rebuild", tenant=tenant.slug)
    assert _rolled(tenant) == expected


def test_the_upgrade_keeps_what_hours_whose_rows_were_deleted_before_it_charted(tenant):
    for n, hours_ago in enumerate((900, 900, 900, 800, 2)):
        at = _hour_ago(hours_ago).isoformat()
        interactions_ingest(tenant, items=[{"client_id": f"u{n}", "prefix": "a", "completion": "b", "served_at": at}])
    labels = [{"client_id": "u0", "outcome": "accepted"}, {"client_id": "u3", "outcome": "rejected"}]
    feedback_ingest(tenant, items=labels)
    rollups_refresh(tenant.pk)
    tenant.retention_days = 30  # hours 900 and 800 are before the cutoff, hour 2 after it
    tenant.save()
    # As before the ledger: a pass deleted old rows and kept no ledger; then u2, kept (say by a running
    # experiment), was labelled late, and its hour, before the cutoff, was never recomputed.
    Interaction.objects.filter(tenant=tenant, client_id__in=["u0", "u1", "u3"]).delete()
    feedback_ingest(tenant, items=[{"client_id": "u2", "outcome": "rejected"}])
    RollupDirty.objects.filter(tenant_id=tenant.pk).delete()
    migration = importlib.import_module("apps.interactions.migrations.0020_rollup_ledger_of_deleted_rows")
    migration.ledger_of_deleted_rows(django_apps, None)
    call_command("rollups_rebuild", tenant=tenant.slug)  # every hour recomputed: raw rows plus ledger
    by_hour: dict[tuple, int] = defaultdict(int)
    for key, counts in _rolled(tenant).items():
        by_hour[(key[0], key[-1])] += counts["requests"]
    old, older = _hour_ago(900), _hour_ago(800)
    # u0 and u1 as they were charted, u2 as it is now, counted once: three requests, not four.
    assert {k[1]: v for k, v in by_hour.items() if k[0] == old} == {"accepted": 1, "": 1, "rejected": 1}
    assert {k[1]: v for k, v in by_hour.items() if k[0] == older} == {"rejected": 1}
    assert sum(by_hour.values()) == 5
