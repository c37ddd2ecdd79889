"""The alarm on retained characters per request, and automatic rollbacks that act only on the
version alarmed and are tried again when refused: real Postgres, interactions built as serving
records them (tests/experiments/test_holdout_alarms.py has the rest)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.services import adapter_version_promote
from apps.common.exceptions import Conflict
from apps.experiments.assignment import HOLDOUT
from apps.experiments.models import PromotionAlarm, PromotionWatch
from apps.experiments.services import promotion_alarm_check
from apps.experiments.services.production import adapter_rollback
from apps.interactions.models import Interaction, PersistenceReport
from apps.tenants.models import AuditEvent
from tests.experiments import test_holdout_alarms
from tests.experiments.test_holdout_alarms import holdout_users, promote_v2_which_learned_to_be_silent, traffic

pytestmark = pytest.mark.django_db

lineage = test_holdout_alarms.lineage  # the fixture: an adapter with a 25 % holdout, v1 in production


def _reports(adapter, version, *, retained: int, arm: str = "") -> None:
    """A report at 30 s keeping everything and one at 10 minutes keeping ``retained`` characters, on
    every accepted suggestion of ``version``: the latest checkpoint is what counts."""
    accepted = Interaction.objects.filter(
        adapter=adapter, adapter_version=version, experiment_arm=arm, feedback__outcome="accepted"
    )
    PersistenceReport.objects.bulk_create(
        PersistenceReport(
            tenant=adapter.tenant, interaction=row, checkpoint_s=checkpoint, accepted_chars=len(row.completion),
            retained_chars=kept, occurred_at=row.served_at, received_at=row.served_at, updated_at=row.served_at,
        )
        for row in accepted
        for checkpoint, kept in ((30, len(row.completion)), (600, retained))
    )  # fmt: skip


def test_an_alarm_fires_on_a_version_whose_accepted_code_developers_delete(lineage):
    adapter, v1, v2 = lineage
    inside, outside = holdout_users(adapter)
    adapter_version_promote(adapter.tenant, version=v2, actor="test")
    adapter.refresh_from_db()
    AuditEvent.objects.filter(action="adapter.promote", data__to=v2.vllm_name).update(
        created_at=timezone.now() - timedelta(hours=3)
    )
    settled = timezone.now() - timedelta(hours=2)  # past every checkpoint: the reports are in
    traffic(adapter, None, inside[:60], shown=0.6, accept=0.4, arm=HOLDOUT, at=settled, seed=21)
    traffic(adapter, v2, outside[:100], shown=0.6, accept=0.4, at=settled, seed=22)  # shows as much, as long
    _reports(adapter, None, retained=12, arm=HOLDOUT)  # "return a + b" kept whole
    _reports(adapter, v2, retained=1)  # kept at 30 s, gone at 10 minutes

    alarms = promotion_alarm_check(adapter)
    assert [(a.metric, a.reference) for a in alarms] == [("retained_chars_per_request", "holdout")]
    assert alarms[0].relative_change < -0.8 and "retained characters per request" in alarms[0].reason
    statuses = {m["metric"]: m["status"] for m in PromotionWatch.objects.get(adapter=adapter).metrics}
    assert statuses == {
        "suggestion_rate": "no_alarm", "suggestion_length": "no_alarm", "retained_chars_per_request": "alarm"
    }  # fmt: skip


def _silent_v2_with_automatic_rollback(lineage):
    adapter, v1, v2 = lineage
    adapter.tenant.experiment_auto_rollback = True
    adapter.tenant.save()
    promote_v2_which_learned_to_be_silent(adapter, v1, v2, with_holdout=False)
    return adapter, v1, v2


def _refusals(caplog) -> int:
    return sum("automatic rollback on alarm refused" in r.getMessage() for r in caplog.records)


def test_an_automatic_rollback_refused_is_tried_again_at_the_next_check(lineage, caplog):
    adapter, v1, v2 = _silent_v2_with_automatic_rollback(lineage)
    with caplog.at_level(logging.WARNING, logger="apps.experiments.services.lineage"):
        assert [a.metric for a in promotion_alarm_check(adapter)] == ["suggestion_rate"]  # no vLLM: refused
        assert promotion_alarm_check(adapter) == []  # raised once, and its rollback tried again
    assert _refusals(caplog) == 2
    assert not PromotionAlarm.objects.get(version=v2).rolled_back
    adapter.refresh_from_db()
    assert adapter.production_version == v2


def test_an_alarm_raised_before_a_person_promoted_the_version_again_is_not_retried(lineage, caplog):
    adapter, v1, v2 = _silent_v2_with_automatic_rollback(lineage)
    with caplog.at_level(logging.WARNING, logger="apps.experiments.services.lineage"):
        assert [a.metric for a in promotion_alarm_check(adapter)] == ["suggestion_rate"]  # no vLLM: refused
        for version in (v1, v2):  # a person rolls back, looks, and chooses v2 again
            adapter_version_promote(adapter.tenant, version=version, actor="a person")
        adapter.refresh_from_db()
        promotion_alarm_check(adapter)
    assert _refusals(caplog) == 1  # the first check's alone
    adapter.refresh_from_db()
    assert adapter.production_version == v2


def test_an_automatic_rollback_never_moves_a_production_promoted_since_the_check_read_it(lineage):
    adapter, v1, v2 = lineage
    v3 = AdapterVersion.objects.create(
        tenant=adapter.tenant, adapter=adapter, number=3, artifact_path="/nonexistent/v3",
        vllm_name="lineage--tab--v3", status="candidate", loaded_at=timezone.now(),
    )  # fmt: skip
    promote_v2_which_learned_to_be_silent(adapter, v1, v2, with_holdout=False)
    assert [a.metric for a in promotion_alarm_check(adapter)] == ["suggestion_rate"]  # automatic rollback off
    adapter.tenant.experiment_auto_rollback = True
    adapter.tenant.save()
    stale = Adapter.objects.select_related("tenant", "production_version").get(pk=adapter.pk)  # beat read v2
    adapter_version_promote(adapter.tenant, version=v3, actor="a person")  # meanwhile
    promotion_alarm_check(stale)
    assert Adapter.objects.get(pk=adapter.pk).production_version == v3
    assert not AuditEvent.objects.filter(tenant=adapter.tenant, action="adapter.rollback").exists()
    with pytest.raises(Conflict, match="no longer version 2"):
        adapter_rollback(adapter.tenant, adapter=stale, to_version=v1, actor="system:alarm", only_from=v2)


def test_a_holdout_snapshot_that_fails_does_not_stop_the_alarms(lineage, monkeypatch):
    from apps.experiments.services import lineage as checks

    adapter, v1, v2 = lineage
    promote_v2_which_learned_to_be_silent(adapter, v1, v2)

    def broken(adapter: Adapter) -> None:
        raise RuntimeError("the snapshot's query failed")

    monkeypatch.setattr(checks, "holdout_snapshot_take", broken)
    assert checks.lineage_checks_all() == 1
    assert [a.metric for a in PromotionAlarm.objects.filter(version=v2)] == ["suggestion_rate"]
