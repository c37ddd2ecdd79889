"""The tenant's management resources (key scope ``admin``): the tenant and its settings, API
keys, the audit log, adapters and their versions, and training (policy, runs, eval set). Each
method builds its call with ``_management_api`` and hands it to the client. Experiments are in
``_async_experiments``."""

# unasync: _management.py is generated from this file. Edit here, then run sdk/scripts/unasync.py.

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from strop import _management_api as api
from strop._adapter_types import Adapter, AdapterVersion, EvalSet, TrainingPolicy, TrainingRun
from strop._async_resources import AsyncAPIResource
from strop._core import without_none
from strop._literals import Scope
from strop._management_types import ApiKey, AuditEvent, Tenant

if TYPE_CHECKING:
    from strop._async_client import AsyncStrop

__all__ = [
    "AsyncAdapterVersions",
    "AsyncAdapters",
    "AsyncAuditEvents",
    "AsyncEvalSets",
    "AsyncKeys",
    "AsyncTenantResource",
    "AsyncTrainingPolicies",
    "AsyncTrainingRuns",
]


class AsyncTenantResource(AsyncAPIResource):
    """The tenant the key belongs to, and its settings."""

    async def get(self) -> Tenant:
        """The tenant, with the calling key (``tenant.key``: its scopes...); any key may ask."""
        return await self._client._run(api.tenant_get())

    async def update(
        self,
        *,
        default_opt_in: bool | None = None,
        experiment_auto_promote: bool | None = None,
        experiment_auto_rollback: bool | None = None,
        accept_pending_feedback: bool | None = None,
        retention_days: int | None = None,
    ) -> Tenant:
        """Change the settings given (None leaves one as it is); audited. ``default_opt_in``: the
        consent of end users first seen without a flag; ``experiment_auto_promote`` /
        ``_rollback``: experiments act on their decision by themselves;
        ``accept_pending_feedback``: keep feedback whose interaction has not arrived yet;
        ``retention_days``: interactions older than this are deleted (at most the operator's
        maximum; what a running experiment, a pending training window or an erase needs stays)."""
        changes = without_none(
            default_opt_in=default_opt_in,
            experiment_auto_promote=experiment_auto_promote,
            experiment_auto_rollback=experiment_auto_rollback,
            accept_pending_feedback=accept_pending_feedback,
            retention_days=retention_days,
        )
        return await self._client._run(api.tenant_update(changes))


class AsyncKeys(AsyncAPIResource):
    """The tenant's API keys."""

    async def list(self) -> builtins.list[ApiKey]:
        """Every key of the tenant, newest first, revoked ones included."""
        return await self._client._run(api.key_list())

    async def create(self, *, name: str, scopes: Sequence[Scope], default_opt_in: bool | None = None) -> ApiKey:
        """A new key with these ``scopes``; its secret is in ``key``, this once. ``default_opt_in``
        is the consent of end users first seen through it without a flag (None: the tenant's)."""
        return await self._client._run(api.key_create(name=name, scopes=scopes, default_opt_in=default_opt_in))

    async def get(self, key_id: int | str) -> ApiKey:
        return await self._client._run(api.key_get(key_id))

    async def revoke(self, key_id: int | str) -> ApiKey:
        """Revoke the key: it stops working at once (``revoked_at`` is set)."""
        return await self._client._run(api.key_revoke(key_id))


class AsyncAuditEvents(AsyncAPIResource):
    async def list(self) -> builtins.list[AuditEvent]:
        """The tenant's audit log, newest first (the latest 200): keys, settings, promotions,
        experiments, erasures..."""
        return await self._client._run(api.audit_event_list())


class AsyncAdapterVersions(AsyncAPIResource):
    """The trained versions of an adapter."""

    async def list(self, adapter: str) -> builtins.list[AdapterVersion]:
        return await self._client._run(api.adapter_version_list(adapter))

    async def get(self, adapter: str, number: int) -> AdapterVersion:
        """One version, with its gate numbers and its ``offline_eval``; ``NotFoundError`` when
        there is none of that number."""
        return await self._client._run(api.adapter_version_get(adapter, number))

    async def promote(self, adapter: str, number: int) -> Adapter:
        """Make the version production (vLLM loads it first if it has not; a failed version is a
        ``ConflictError``); audited. The adapter, with its new ``production_version``."""
        return await self._client._run(api.adapter_version_promote(adapter, number))

    async def purge(self, adapter: str, number: int) -> AdapterVersion:
        """Delete the version's weights from the adapter store, every stored copy: for versions that
        learned from an erased end user (or descend from one), once replaced (not production, in no
        open experiment; else a ``ConflictError``); audited. The version, now ``purged``."""
        return await self._client._run(api.adapter_version_purge(adapter, number))


class AsyncAdapters(AsyncAPIResource):
    """The tenant's adapters (made by the operator: ``manage.py adapter_create``; the API has no
    call that creates one)."""

    def __init__(self, client: AsyncStrop) -> None:
        super().__init__(client)
        self.versions = AsyncAdapterVersions(client)

    async def list(self) -> builtins.list[Adapter]:
        """Every adapter and the version each serves in production."""
        return await self._client._run(api.adapter_list())

    async def get(self, adapter: str) -> Adapter:
        """One adapter by name (read from the list: the API has no read of one adapter);
        ``NotFoundError`` when the tenant has none of that name."""
        return await self._client._run(api.adapter_get(adapter))

    async def rollback(self, adapter: str, *, version: int) -> Adapter:
        """Move production back to an earlier good ``version`` (a running experiment is stopped
        first); audited."""
        return await self._client._run(api.adapter_rollback(adapter, version=version))

    async def retrain(self, adapter: str) -> TrainingRun:
        """Retrain the adapter's lineage without the end users erased since its versions learned
        from them: a run from the newest version that learned from none of them. A
        ``ConflictError`` when no version learned from an erased user, or a run is going."""
        return await self._client._run(api.adapter_retrain(adapter))


class AsyncTrainingPolicies(AsyncAPIResource):
    """When an adapter trains, on what reward, with which trainer and gate settings."""

    async def get(self, adapter: str) -> TrainingPolicy:
        return await self._client._run(api.training_policy_get(adapter))

    async def update(
        self,
        adapter: str,
        *,
        enabled: bool | None = None,
        min_new_events: int | None = None,
        max_wait_s: int | None = None,
        heldout_fraction: float | None = None,
        reward_accepted: float | None = None,
        reward_rejected: float | None = None,
        reward_not_shown: float | None = None,
        reward_edited: float | None = None,
        reward_partial: float | None = None,
        reward_thumbs_up: float | None = None,
        reward_thumbs_down: float | None = None,
        reward_edit_persisted: float | None = None,
        reward_edit_reverted: float | None = None,
        reward_follow_up_dissatisfied: float | None = None,
        reward_tool_call_failed: float | None = None,
        auto_experiment: bool | None = None,
        credit_retained: bool | None = None,
        show_gate: bool | None = None,
        show_gate_recall: float | None = None,
        show_gate_explore: float | None = None,
        trainer_overrides: Mapping[str, Any] | None = None,
        gate_overrides: Mapping[str, Any] | None = None,
    ) -> TrainingPolicy:
        """Change the fields given (None leaves one as it is; ``{}`` clears the overrides);
        audited. A bad value is a ``BadRequestError`` naming the field, and changes nothing.
        ``policy.override_limits`` lists the keys the overrides may hold."""
        changes = without_none(
            enabled=enabled,
            min_new_events=min_new_events,
            max_wait_s=max_wait_s,
            heldout_fraction=heldout_fraction,
            reward_accepted=reward_accepted,
            reward_rejected=reward_rejected,
            reward_not_shown=reward_not_shown,
            reward_edited=reward_edited,
            reward_partial=reward_partial,
            reward_thumbs_up=reward_thumbs_up,
            reward_thumbs_down=reward_thumbs_down,
            reward_edit_persisted=reward_edit_persisted,
            reward_edit_reverted=reward_edit_reverted,
            reward_follow_up_dissatisfied=reward_follow_up_dissatisfied,
            reward_tool_call_failed=reward_tool_call_failed,
            auto_experiment=auto_experiment,
            credit_retained=credit_retained,
            show_gate=show_gate,
            show_gate_recall=show_gate_recall,
            show_gate_explore=show_gate_explore,
            trainer_overrides=None if trainer_overrides is None else dict(trainer_overrides),
            gate_overrides=None if gate_overrides is None else dict(gate_overrides),
        )
        return await self._client._run(api.training_policy_update(adapter, changes))


class AsyncTrainingRuns(AsyncAPIResource):
    async def list(self, adapter: str) -> builtins.list[TrainingRun]:
        """The adapter's runs, newest first (the latest 100)."""
        return await self._client._run(api.training_run_list(adapter))

    async def get(self, run_id: int | str) -> TrainingRun:
        return await self._client._run(api.training_run_get(run_id))

    async def start(self, adapter: str) -> TrainingRun:
        """Start a run now, whatever the policy says (``status`` ``queued``). A
        ``ConflictError`` when one is already going for the adapter, or the tenant is at its cap."""
        return await self._client._run(api.training_run_start(adapter))

    async def exclude_window(self, run_id: int | str) -> TrainingRun:
        """Leave a rejected run's events (its window and what it held out) out of every later run,
        for good: where the client reported them wrongly and cannot send them again (else send
        the right outcomes with a later ``occurred_at``). A ``ConflictError`` (``run_not_rejected``)
        for a run that is not rejected; again, it changes nothing."""
        return await self._client._run(api.training_run_exclude_window(run_id))


class AsyncEvalSets(AsyncAPIResource):
    async def upload(self, adapter: str, *, cases: Sequence[Mapping[str, Any]]) -> EvalSet:
        """Replace the adapter's eval set: fill-in-the-middle ``cases`` (``{"prefix", "suffix",
        "middle"}``, at most 500) that every candidate must not do worse on than its parent."""
        return await self._client._run(api.eval_set_upload(adapter, cases))
