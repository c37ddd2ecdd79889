"""Holdouts (users kept on the base model across promotions) and the alarms on a promoted version
that learned to show less: real Postgres, interactions built as serving records them."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.adapters.services import adapter_version_promote
from apps.experiments.assignment import HOLDOUT, in_holdout
from apps.experiments.models import Experiment, ExperimentExposure, PromotionAlarm, PromotionWatch
from apps.experiments.services import holdout_snapshot_take, lineage_checks_all, promotion_alarm_check
from apps.interactions.models import Feedback, Interaction
from apps.notifications.models import Webhook, WebhookDelivery
from apps.serving.services import serving_route
from apps.tenants.models import AuditEvent
from apps.tenants.services import tenant_create

pytestmark = pytest.mark.django_db

USERS = [f"dev-{i:03d}" for i in range(400)]


@pytest.fixture
def lineage():
    """An adapter with a 25 % holdout and v1 in production, v2 loaded beside it."""
    tenant = tenant_create(name="Lineage", slug="lineage")
    base = BaseModel.objects.create(name="lineage-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True, holdout_share=0.25)
    versions = [
        AdapterVersion.objects.create(
            tenant=tenant,
            adapter=adapter,
            number=n,
            artifact_path=f"/nonexistent/v{n}",
            vllm_name=f"lineage--tab--v{n}",
            status="candidate",
            loaded_at=timezone.now(),
        )
        for n in (1, 2)
    ]
    adapter_version_promote(tenant, version=versions[0], actor="test")
    adapter.refresh_from_db()
    return adapter, versions[0], versions[1]


def holdout_users(adapter: Adapter) -> tuple[list[str], list[str]]:
    inside = [u for u in USERS if in_holdout(adapter_id=adapter.pk, share=adapter.holdout_share, external_id=u)]
    return inside, [u for u in USERS if u not in inside]


def traffic(
    adapter, version, users, *, shown: float, accept: float, arm: str = "", at=None, seed: int = 0, requests: int = 5
) -> None:
    """Five requests a user (or ``requests``), as serving records them: a suggestion (or nothing)
    and its feedback."""
    rng = random.Random(seed)
    at = at or timezone.now()
    interactions, feedback = [], []
    for user in users:
        for _ in range(requests):
            text = "return a + b" if rng.random() < shown else ""
            row = Interaction(
                id=uuid.uuid4(),
                tenant=adapter.tenant,
                source="served",
                prompt="def add(a, b):\n    ",
                completion=text,
                adapter=adapter,
                adapter_version=version,
                experiment_arm=arm,
                end_user_id=user,
                end_user_opted_in=True,
                served_at=at,
                received_at=at,
                latency_ms=40,
            )
            interactions.append(row)
            outcome = "not_shown" if not text else ("accepted" if rng.random() < accept else "rejected")
            feedback.append(
                Feedback(
                    tenant=adapter.tenant,
                    interaction=row,
                    outcome=outcome,
                    occurred_at=at,
                    received_at=at,
                    updated_at=at,
                )
            )
    Interaction.objects.bulk_create(interactions)
    Feedback.objects.bulk_create(feedback)


def test_holdout_assignment_is_stable_and_a_larger_share_only_adds_users(lineage):
    adapter, v1, v2 = lineage
    inside, _ = holdout_users(adapter)
    assert inside == holdout_users(adapter)[0]  # deterministic
    ids = [f"user-{i}" for i in range(10_000)]
    at = {s: {u for u in ids if in_holdout(adapter_id=adapter.pk, share=s, external_id=u)} for s in (0.05, 0.1)}
    assert 400 < len(at[0.05]) < 600 and 900 < len(at[0.1]) < 1100
    assert at[0.05] < at[0.1]
    other = {u for u in ids if in_holdout(adapter_id=adapter.pk + 1, share=0.1, external_id=u)}
    assert len(other & at[0.1]) < 200  # another adapter's holdout is drawn independently
    assert not in_holdout(adapter_id=adapter.pk, share=0.0, external_id=ids[0])


def test_holdout_users_get_the_base_model_across_promotions_and_no_experiment(lineage):
    adapter, v1, v2 = lineage
    inside, outside = holdout_users(adapter)
    experiment = Experiment.objects.create(
        tenant=adapter.tenant,
        adapter=adapter,
        control_version=v1,
        candidate_version=v2,
        salt="s",
        status="running",
        started_at=timezone.now(),
        created_by="test",
    )
    for production in (v1, v2):
        adapter_version_promote(adapter.tenant, version=production, actor="test")
        adapter.refresh_from_db()
        for user in inside[:20]:
            route = serving_route(adapter.tenant, adapter=adapter, end_user_id=user, opted_in=True, running=experiment)
            assert (route.version, route.arm, route.experiment) == (None, HOLDOUT, None)
            assert route.recorded()["experiment_arm"] == HOLDOUT
        route = serving_route(adapter.tenant, adapter=adapter, end_user_id=outside[0], opted_in=True, running=None)
        assert route.version == production and route.arm == ""
    assert not ExperimentExposure.objects.filter(experiment=experiment, end_user__external_id__in=inside).exists()
    # Opted out: never in the holdout (nor in any experiment): production.
    route = serving_route(adapter.tenant, adapter=adapter, end_user_id=inside[0], opted_in=False, running=None)
    assert route.version == v2 and route.arm == ""


def promote_v2_which_learned_to_be_silent(adapter, v1, v2, *, with_holdout: bool = True) -> None:
    inside, outside = holdout_users(adapter)
    before = timezone.now() - timedelta(hours=1)
    traffic(adapter, v1, outside[:100], shown=0.6, accept=0.3, at=before, seed=1)
    adapter_version_promote(adapter.tenant, version=v2, actor="test")
    adapter.refresh_from_db()
    after = timezone.now() + timedelta(seconds=1)
    if with_holdout:
        traffic(adapter, None, inside[:60], shown=0.6, accept=0.3, arm=HOLDOUT, at=after, seed=2)
    # Shows a suggestion one request in ten, accepted more often: better on accept rate of shown.
    traffic(adapter, v2, outside[100:200], shown=0.1, accept=0.6, at=after, seed=3)


def test_an_alarm_fires_on_a_version_that_learned_to_be_silent(lineage):
    adapter, v1, v2 = lineage
    Webhook.objects.create(
        tenant=adapter.tenant, url="https://hooks.example.com/strop", events=["version.alarm"], secret="x"
    )
    promote_v2_which_learned_to_be_silent(adapter, v1, v2)

    alarms = promotion_alarm_check(adapter)
    assert [a.metric for a in alarms] == ["suggestion_rate"]
    alarm = alarms[0]
    assert alarm.version == v2 and alarm.reference == "holdout" and alarm.relative_change < -0.5
    assert not alarm.rolled_back  # the tenant's automatic rollback is off
    assert "suggestions shown per request" in alarm.reason
    delivery = WebhookDelivery.objects.get(tenant=adapter.tenant, event="version.alarm")
    assert delivery.payload["data"]["metric"] == "suggestion_rate" and delivery.payload["data"]["version"] == 2
    assert AuditEvent.objects.filter(tenant=adapter.tenant, action="adapter.alarm", target_id="tab").count() == 1
    assert promotion_alarm_check(adapter) == []  # once per version and metric
    adapter.refresh_from_db()
    assert adapter.production_version == v2
    watch = PromotionWatch.objects.get(adapter=adapter)
    assert (watch.version, watch.reference) == (v2, "holdout")
    statuses = {m["metric"]: m["status"] for m in watch.metrics}
    # Retained characters wait for their reports to settle: this traffic is a second old.
    assert statuses == {
        "suggestion_rate": "alarm", "suggestion_length": "no_alarm", "retained_chars_per_request": "not_testable"
    }  # fmt: skip
    assert all(min(m["effective_users"]) >= 20 for m in watch.metrics if m["status"] != "not_testable")


def test_a_silent_version_whose_drop_rests_on_a_few_heavy_users_raises_no_alarm_and_says_why(lineage, make_client):
    adapter, v1, v2 = lineage
    adapter.tenant.experiment_auto_rollback = True
    adapter.tenant.save()
    inside, outside = holdout_users(adapter)
    adapter_version_promote(adapter.tenant, version=v2, actor="test")
    adapter.refresh_from_db()
    after = timezone.now() + timedelta(seconds=1)
    traffic(adapter, None, inside[:60], shown=0.6, accept=0.3, arm=HOLDOUT, at=after, seed=9)
    # 30 users on v2, but three of them make 900 of its 927 requests and are shown almost nothing:
    # the drop (about -90 %) is theirs, worth about three equally busy users.
    traffic(adapter, v2, outside[:3], shown=0.05, accept=0.6, at=after, seed=10, requests=300)
    traffic(adapter, v2, outside[3:30], shown=0.6, accept=0.3, at=after, seed=11, requests=1)

    assert promotion_alarm_check(adapter) == []
    assert not PromotionAlarm.objects.exists()
    assert not AuditEvent.objects.filter(tenant=adapter.tenant, action__in=["adapter.alarm", "adapter.rollback"])
    adapter.refresh_from_db()
    assert adapter.production_version == v2  # the automatic rollback has nothing to act on
    watch = PromotionWatch.objects.get(adapter=adapter)
    rate = next(m for m in watch.metrics if m["metric"] == "suggestion_rate")
    assert rate["status"] == "too_few_effective_users" and rate["relative_change"] < -0.5
    assert rate["users"] == [60, 30] and rate["effective_users"][0] >= 20 and rate["effective_users"][1] < 5
    assert rate["reason"].startswith("Too few effective users:") and "no alarm rests on them" in rate["reason"]

    body = make_client(adapter.tenant, scopes=["admin"]).get("/v1/adapters/tab/holdout").json()
    assert body["alarms"] == [] and body["watch"]["version"] == 2 and body["watch"]["reference"] == "holdout"
    statuses = {m["metric"]: m["status"] for m in body["watch"]["metrics"]}
    assert statuses["suggestion_rate"] == "too_few_effective_users"


def test_without_a_holdout_the_version_before_is_the_reference(lineage):
    adapter, v1, v2 = lineage
    Adapter.objects.filter(pk=adapter.pk).update(holdout_share=0)
    adapter.refresh_from_db()
    promote_v2_which_learned_to_be_silent(adapter, v1, v2, with_holdout=False)
    assert [(a.metric, a.reference) for a in promotion_alarm_check(adapter)] == [("suggestion_rate", "previous")]


def test_a_holdout_of_a_few_heavy_users_gives_way_to_the_version_before(lineage):
    # 25 users in the holdout, but three of them make nearly all its requests: no alarm could rest on
    # it, while v1 had the traffic to judge by. The check compares with v1, and the silent v2 is caught.
    adapter, v1, v2 = lineage
    inside, outside = holdout_users(adapter)
    promote_v2_which_learned_to_be_silent(adapter, v1, v2, with_holdout=False)
    after = timezone.now() + timedelta(seconds=1)
    traffic(adapter, None, inside[:3], shown=0.6, accept=0.3, arm=HOLDOUT, at=after, seed=12, requests=300)
    traffic(adapter, None, inside[3:25], shown=0.6, accept=0.3, arm=HOLDOUT, at=after, seed=13, requests=1)
    assert [(a.metric, a.reference) for a in promotion_alarm_check(adapter)] == [("suggestion_rate", "previous")]
    watch = PromotionWatch.objects.get(adapter=adapter)
    assert watch.reference == "previous"
    assert {m["metric"]: m["status"] for m in watch.metrics}["suggestion_rate"] == "alarm"


def test_a_first_version_with_no_holdout_is_not_testable_and_says_why(lineage):
    adapter, v1, v2 = lineage
    Adapter.objects.filter(pk=adapter.pk).update(holdout_share=0)
    adapter.refresh_from_db()
    after = timezone.now() + timedelta(seconds=1)
    traffic(adapter, v1, holdout_users(adapter)[1][:30], shown=0.6, accept=0.3, at=after)
    assert promotion_alarm_check(adapter) == []
    watch = PromotionWatch.objects.get(adapter=adapter)
    assert {m["status"] for m in watch.metrics} == {"not_testable"}
    assert all("keeps no holdout" in m["reason"] for m in watch.metrics)


def test_a_version_that_shows_as_much_raises_no_alarm(lineage):
    adapter, v1, v2 = lineage
    inside, outside = holdout_users(adapter)
    adapter_version_promote(adapter.tenant, version=v2, actor="test")
    adapter.refresh_from_db()
    after = timezone.now() + timedelta(seconds=1)
    traffic(adapter, None, inside[:60], shown=0.6, accept=0.3, arm=HOLDOUT, at=after, seed=4)
    traffic(adapter, v2, outside[:100], shown=0.6, accept=0.4, at=after, seed=5)
    assert promotion_alarm_check(adapter) == []
    assert lineage_checks_all() == 1 and not PromotionAlarm.objects.exists()


def test_the_holdout_snapshot_compares_the_lineage_with_the_base_model(lineage):
    adapter, v1, v2 = lineage
    inside, outside = holdout_users(adapter)
    traffic(adapter, None, inside[:60], shown=0.6, accept=0.2, arm=HOLDOUT, seed=6)
    traffic(adapter, v1, outside[:150], shown=0.6, accept=0.5, seed=7)
    # A holdout user's traffic without the arm (logged, or from before the holdout) is not the lineage's.
    traffic(adapter, v1, inside[60:80], shown=0.6, accept=0.9, seed=8)
    first = holdout_snapshot_take(adapter)
    assert lineage_checks_all() == 1
    assert list(adapter.holdout_snapshots.all()) == [first]  # recomputed at most every 10 minutes
    snapshot = holdout_snapshot_take(adapter)
    assert list(adapter.holdout_snapshots.all()) == [snapshot] and first.analysis == snapshot.analysis
    assert snapshot.users == 210
    arms = snapshot.analysis["arms"]
    assert (arms["control"]["users"], arms["candidate"]["users"]) == (60, 150)
    primary = snapshot.analysis["metrics"][0]
    assert primary["name"] == "reward_per_request" and primary["direction"] == "better"
    assert [m["name"] for m in snapshot.analysis["metrics"]][1:] == [
        "accept_rate",
        "accepted_per_request",
        "suggestion_rate",
    ]


@pytest.mark.vllm
def test_with_automatic_rollback_on_an_alarm_moves_production_back_and_is_audited(
    serving_tenant, serving_adapter, probed_version
):
    serving_tenant.experiment_auto_rollback = True
    serving_tenant.save()
    v1 = probed_version(seed=71)
    adapter_version_promote(serving_tenant, version=v1, actor="test")
    v2 = probed_version(seed=72, parent=v1)
    serving_adapter.refresh_from_db()
    promote_v2_which_learned_to_be_silent(serving_adapter, v1, v2, with_holdout=False)

    alarms = promotion_alarm_check(serving_adapter)
    assert [(a.metric, a.reference, a.rolled_back) for a in alarms] == [("suggestion_rate", "previous", True)]
    serving_adapter.refresh_from_db()
    assert serving_adapter.production_version == v1
    rollback = AuditEvent.objects.get(tenant=serving_tenant, action="adapter.rollback")
    assert rollback.actor == "system:alarm" and rollback.data["to"] == v1.vllm_name
    assert PromotionAlarm.objects.get(version=v2).rolled_back
    assert promotion_alarm_check(serving_adapter) == []  # production moved back: nothing to watch


def test_the_holdout_is_set_and_read_over_the_api_and_a_bad_share_names_the_field(lineage, make_client):
    adapter, v1, v2 = lineage
    client = make_client(adapter.tenant, scopes=["admin"])
    answer = client.put("/v1/adapters/tab/holdout", {"share": 0.8}, format="json")
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "share"
    adapter.refresh_from_db()
    assert adapter.holdout_share == 0.25  # nothing changed
    answer = client.put("/v1/adapters/tab/holdout", {"share": 0.05}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["share"] == 0.05 and answer.json()["latest"] is None and answer.json()["alarms"] == []
    assert answer.json()["watch"] is None  # v1's promotion has not been checked
    adapter.refresh_from_db()
    assert adapter.holdout_share == 0.05
    audit = AuditEvent.objects.get(tenant=adapter.tenant, action="adapter.holdout")
    assert audit.data == {"before": 0.25, "after": 0.05}
    holdout_snapshot_take(adapter)
    body = client.get("/v1/adapters/tab/holdout").json()
    assert body["latest"]["analysis"]["metrics"][0]["name"] == "reward_per_request"
    assert client.get("/v1/adapters/nope/holdout").status_code == 404
    serving_key = make_client(adapter.tenant, scopes=["serve"])
    assert serving_key.put("/v1/adapters/tab/holdout", {"share": 0.1}, format="json").status_code == 403


def test_the_holdout_share_does_not_change_while_an_experiment_runs(lineage, make_client):
    """The holdout is read before the experiment: a larger one would move users the experiment
    exposed out of their arm, and a user's arm never moves."""
    from apps.experiments.models import Experiment
    from apps.experiments.services import experiment_create

    adapter, _, v2 = lineage
    experiment = experiment_create(adapter.tenant, adapter=adapter, candidate_version=v2, actor="test")
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    client = make_client(adapter.tenant, scopes=["admin"])
    answer = client.put("/v1/adapters/tab/holdout", {"share": 0.4}, format="json")
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "experiment_running", answer.content
    adapter.refresh_from_db()
    assert adapter.holdout_share == 0.25
    assert client.put("/v1/adapters/tab/holdout", {"share": 0.25}, format="json").status_code == 200  # unchanged
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.STOPPED)
    assert client.put("/v1/adapters/tab/holdout", {"share": 0.4}, format="json").status_code == 200
