"""Experiments (key scope ``admin``) and the assignment of an end user to an arm (key scope
``serve`` or ``ingest``). Each method builds its call with ``_management_api``."""

# unasync: _experiments.py is generated from this file. Edit here, then run sdk/scripts/unasync.py.

from __future__ import annotations

import builtins
from collections.abc import Sequence

from strop import _management_api as api
from strop._async_resources import AsyncAPIResource
from strop._experiment_types import Assignment, Experiment, Holdout, Snapshot
from strop._literals import Metric

__all__ = ["AsyncExperiments"]


class AsyncExperiments(AsyncAPIResource):
    """A/B experiments of an adapter: a candidate version against production on the opted-in
    cohort. Every call that changes one answers the experiment with its latest statistics."""

    async def list(self, adapter: str) -> builtins.list[Experiment]:
        """The adapter's experiments, newest first (the latest 100; ``latest`` is None here)."""
        return await self._client._run(api.experiment_list(adapter))

    async def create(
        self,
        adapter: str,
        *,
        candidate_version: int,
        candidate_weight: float | None = None,
        primary_metric: Metric | None = None,
        guardrails: Sequence[Metric] | None = None,
        secondary_metrics: Sequence[Metric] | None = None,
        min_users_per_arm: int | None = None,
        min_effective_users_per_arm: int | None = None,
        max_duration_s: int | None = None,
        alpha: float | None = None,
        expected_users: int | None = None,
        start: bool | None = None,
    ) -> Experiment:
        """A draft experiment of ``candidate_version`` (a version that passed the gate) against
        production; ``start=True`` starts it at once. ``candidate_weight``: the share of the cohort
        on the candidate (default 0.5); ``expected_users``: users (both arms) the always-valid
        interval is tuned to (default 5000; a smaller cohort should say so); ``secondary_metrics``:
        reported beside the primary, deciding nothing (an agent adapter's positive rates). None
        leaves the server's default."""
        call = api.experiment_create(
            adapter,
            candidate_version=candidate_version,
            candidate_weight=candidate_weight,
            primary_metric=primary_metric,
            guardrails=guardrails,
            secondary_metrics=secondary_metrics,
            min_users_per_arm=min_users_per_arm,
            min_effective_users_per_arm=min_effective_users_per_arm,
            max_duration_s=max_duration_s,
            alpha=alpha,
            expected_users=expected_users,
            start=start,
        )
        return await self._client._run(call)

    async def get(self, experiment_id: int | str) -> Experiment:
        """The experiment with its ``latest`` statistics."""
        return await self._client._run(api.experiment_get(experiment_id))

    async def snapshots(self, experiment_id: int | str) -> builtins.list[Snapshot]:
        """Every statistics snapshot, oldest first: the experiment over time."""
        return await self._client._run(api.experiment_snapshots(experiment_id))

    async def start(self, experiment_id: int | str) -> Experiment:
        """Start a draft: vLLM loads the candidate and it is serve-probed first (a
        ``ConflictError`` when it serves other weights than the trainer's)."""
        return await self._client._run(api.experiment_act(experiment_id, "start"))

    async def stop(self, experiment_id: int | str, *, reason: str | None = None) -> Experiment:
        """End a running experiment without a verdict: everyone gets production again."""
        return await self._client._run(api.experiment_act(experiment_id, "stop", reason=reason))

    async def promote(self, experiment_id: int | str, *, reason: str | None = None) -> Experiment:
        """Make the candidate production."""
        return await self._client._run(api.experiment_act(experiment_id, "promote", reason=reason))

    async def rollback(self, experiment_id: int | str, *, reason: str | None = None) -> Experiment:
        """Reject the candidate: production stays as it was, the candidate is retired."""
        return await self._client._run(api.experiment_act(experiment_id, "rollback", reason=reason))

    async def snapshot(self, experiment_id: int | str) -> Experiment:
        """Compute the statistics of a running experiment now (and act on them as the tenant
        chose: auto promote / rollback); the experiment with them as ``latest``."""
        return await self._client._run(api.experiment_act(experiment_id, "snapshot"))

    async def assignment(self, adapter: str, user: str, *, opted_in: bool | None = None) -> Assignment:
        """Which arm and version serve ``user`` (your end-user id) on ``adapter`` now, for serving
        elsewhere (key scope ``serve`` or ``ingest``: it records the user's consent, ``opted_in``
        when you know it, and their exposure to the experiment)."""
        return await self._client._run(api.experiment_assignment(adapter, user, opted_in=opted_in))

    async def holdout(self, adapter: str) -> Holdout:
        """The adapter's holdout share, the lineage's cumulative lift against it and the alarms
        raised after promotions (docs/experiments.md)."""
        return await self._client._run(api.holdout_get(adapter))

    async def set_holdout(self, adapter: str, *, share: float) -> Holdout:
        """Keep ``share`` (0 to 0.5) of the adapter's opted-in users on the base model across
        promotions (0: no holdout); audited."""
        return await self._client._run(api.holdout_set(adapter, share=share))
