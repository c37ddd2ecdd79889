"""The tenant's management through the SDK, against the live API: the tenant and its settings, the
audit log, adapters, the training policy, training runs and the eval set (nothing here needs
vLLM: no version is served)."""

from __future__ import annotations

import asyncio

import pytest
from strop import (
    Adapter,
    AsyncStrop,
    AuditEvent,
    BadRequestError,
    ConflictError,
    EvalSet,
    Health,
    NotFoundError,
    PermissionDeniedError,
    Strop,
    Tenant,
    TrainingPolicy,
    TrainingRun,
)

from apps.tenants.models import Tenant as TenantRow
from apps.tenants.services import ALL_SCOPES
from apps.training.models import EvalSet as EvalSetRow
from apps.training.models import TrainingPolicy as TrainingPolicyRow
from apps.training.models import TrainingRun as TrainingRunRow

pytestmark = pytest.mark.django_db(transaction=True)

CASES = [
    {"prefix": "def f():\n    ", "suffix": "\n", "middle": "return 1"},
    {"prefix": "def g():\n    ", "suffix": "\n", "middle": "return 2"},
]


def test_tenant_get_names_the_tenant_and_the_calling_key(strop_client, api):
    tenant = strop_client.tenant.get()
    assert isinstance(tenant, Tenant) and (tenant.slug, tenant.name) == (api.tenant.slug, api.tenant.name)
    assert tenant.key is not None and tenant.key.scopes == list(ALL_SCOPES)
    assert tenant.created_at is not None and tenant.created_at.tzinfo is not None


def test_tenant_update_changes_only_the_settings_given_and_is_audited(strop_client, api, make_api):
    before = TenantRow.objects.get(pk=api.tenant.pk)
    updated = strop_client.tenant.update(default_opt_in=not before.default_opt_in)
    after = TenantRow.objects.get(pk=api.tenant.pk)
    assert updated.default_opt_in is after.default_opt_in is (not before.default_opt_in)
    assert updated.key is None  # the answer to an update names no key
    assert (after.experiment_auto_promote, after.accept_pending_feedback) == (
        before.experiment_auto_promote,
        before.accept_pending_feedback,
    )
    (event,) = [e for e in strop_client.audit_events.list() if e.action == "tenant.settings"]
    assert isinstance(event, AuditEvent) and event.target_id == api.tenant.slug

    reader = make_api(scopes=["ingest"])
    with Strop(base_url=reader.url, api_key=reader.key, max_retries=0) as ingest_only:
        assert ingest_only.tenant.get().key.scopes == ["ingest"]  # any key reads its tenant
        with pytest.raises(PermissionDeniedError):
            ingest_only.tenant.update(default_opt_in=True)
    assert TenantRow.objects.get(pk=reader.tenant.pk).default_opt_in == reader.tenant.default_opt_in


def test_the_audit_log_lists_what_keys_did_newest_first(strop_client):
    created = strop_client.keys.create(name="plugin", scopes=["feedback"])
    strop_client.keys.revoke(created.id)
    actions = [(e.action, e.target_id) for e in strop_client.audit_events.list()]
    assert actions.index(("api_key.revoke", str(created.id))) < actions.index(("api_key.create", str(created.id)))


def test_adapters_are_listed_and_read_by_name(strop_client, tab_adapter):
    (listed,) = strop_client.adapters.list()
    assert isinstance(listed, Adapter) and (listed.name, listed.base_model, listed.is_default) == ("tab", "base", True)
    assert listed.production_version is None  # the base model serves
    assert strop_client.adapters.get("tab") == listed
    with pytest.raises(NotFoundError) as caught:
        strop_client.adapters.get("nope")
    assert caught.value.code == "not_found" and caught.value.status_code == 404
    with pytest.raises(NotFoundError):
        strop_client.adapters.versions.get("tab", 1)  # no version yet
    assert strop_client.adapters.versions.list("tab") == []


def test_the_training_policy_is_read_and_changed_and_a_bad_value_changes_nothing(strop_client, tab_adapter):
    policy = strop_client.training_policy.get("tab")
    assert isinstance(policy, TrainingPolicy) and policy.override_limits
    changed = strop_client.training_policy.update(
        "tab", min_new_events=64, reward_rejected=-1, trainer_overrides={"epochs": 2}
    )
    assert (changed.min_new_events, changed.reward_rejected, changed.trainer_overrides) == (64, -1.0, {"epochs": 2})
    assert changed.reward_accepted == policy.reward_accepted  # what was not given stays
    assert strop_client.training_policy.get("tab") == changed

    with pytest.raises(BadRequestError) as caught:
        strop_client.training_policy.update("tab", min_new_events=5, heldout_fraction=0.95)
    assert caught.value.param == "heldout_fraction"
    stored = TrainingPolicyRow.objects.get(adapter=tab_adapter)
    assert (stored.min_new_events, stored.heldout_fraction) == (64, policy.heldout_fraction)


def test_an_eval_set_upload_replaces_the_cases(strop_client, tab_adapter):
    uploaded = strop_client.eval_sets.upload("tab", cases=CASES)
    assert isinstance(uploaded, EvalSet) and uploaded.cases == 2 and uploaded.uploaded_at is not None
    assert EvalSetRow.objects.get(adapter=tab_adapter).cases == CASES
    with pytest.raises(BadRequestError) as caught:
        strop_client.eval_sets.upload("tab", cases=[{"prefix": "x"}])
    assert caught.value.message.startswith("cases[0]")
    assert EvalSetRow.objects.get(adapter=tab_adapter).cases == CASES


def test_a_started_run_is_queued_listed_and_read_and_a_second_is_a_conflict(strop_client, tab_adapter):
    started = strop_client.training_runs.start("tab")
    assert isinstance(started, TrainingRun) and (started.status, started.trigger, started.adapter) == (
        "queued",
        "forced",
        "tab",
    )
    with pytest.raises(ConflictError) as caught:
        strop_client.training_runs.start("tab")
    assert caught.value.code == "run_active"
    assert [run.id for run in strop_client.training_runs.list("tab")] == [started.id]
    read = strop_client.training_runs.get(started.id)
    assert (read.id, read.status, read.erased_users) == (started.id, "queued", 0)
    with pytest.raises(ConflictError):
        strop_client.adapters.retrain("tab")  # no version learned from an erased end user
    assert TrainingRunRow.objects.filter(adapter=tab_adapter).count() == 1


def test_another_tenants_adapter_and_run_are_not_found(strop_client, tab_adapter, make_api):
    run = strop_client.training_runs.start("tab")
    policy = strop_client.training_policy.get("tab")
    other = make_api()
    with Strop(base_url=other.url, api_key=other.key, max_retries=0) as theirs:
        with pytest.raises(NotFoundError):
            theirs.training_runs.get(run.id)
        with pytest.raises(NotFoundError):
            theirs.training_policy.update("tab", min_new_events=1)
    assert strop_client.training_policy.get("tab") == policy


def test_the_async_client_manages_the_tenant_too(api, tab_adapter):
    async def main() -> tuple[Health, Tenant, TrainingPolicy, list[Adapter]]:
        async with AsyncStrop(base_url=api.url, api_key=api.key) as client:
            return (
                await client.health.check(),
                await client.tenant.update(accept_pending_feedback=False),
                await client.training_policy.update("tab", enabled=False),
                await client.adapters.list(),
            )

    health, tenant, policy, adapters = asyncio.run(main())
    assert (health.status, health.database) == ("ok", "postgresql")
    assert tenant.accept_pending_feedback is False and policy.enabled is False
    assert [adapter.name for adapter in adapters] == ["tab"]
    assert TenantRow.objects.get(pk=api.tenant.pk).accept_pending_feedback is False
