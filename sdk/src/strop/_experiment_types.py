"""Typed results of the experiment calls: experiments, their statistics snapshots, and the
assignment of an end user to an arm. Lenient, as in ``_types``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from strop._types import from_fields, parse_datetime

__all__ = ["Assignment", "Experiment", "Holdout", "Snapshot"]


@dataclass
class Snapshot:
    """An experiment's statistics at ``computed_at``: the ``users`` counted, the ``action`` they
    call for (``keep_running``, ``promote``, ``rollback``...) and the ``analysis`` behind it
    (per metric and arm; ``analysis["decision"]["reason"]`` says why)."""

    computed_at: datetime | None
    users: int | None
    action: str | None
    analysis: dict[str, Any] | None
    seconds: float | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Snapshot:
        return from_fields(cls, data, computed_at=parse_datetime)


@dataclass
class Experiment:
    """An A/B experiment of an adapter: its ``candidate_version`` against production
    (``control_version``; None: the base model) on the opted-in cohort, ``candidate_weight`` of
    them on the candidate. ``status``: ``draft``, ``running``, ``stopped`` or ``decided``
    (``decision``: ``promote`` / ``rollback``, with ``decision_reason``). ``latest`` is the newest
    statistics snapshot (None before the first, and in ``experiments.list``)."""

    id: int
    adapter: str | None
    status: str
    control_version: int | None
    candidate_version: int | None
    candidate_weight: float | None
    config: dict[str, Any] | None
    auto_promote: bool | None
    auto_rollback: bool | None
    decision: str | None
    decision_reason: str | None
    created_by: str | None
    created_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    ended_by: str | None
    latest: Snapshot | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Experiment:
        dates = dict.fromkeys(("created_at", "started_at", "ended_at"), parse_datetime)
        return from_fields(cls, data, latest=Snapshot.from_json, **dates)


@dataclass
class Assignment:
    """Which version serves ``user`` on ``adapter`` now: in a running ``experiment`` an opted-in
    user gets their ``arm`` (``control`` / ``candidate``), everyone else production (``arm``
    None). ``version`` is its number (None: the base model), ``model`` the vLLM name to serve."""

    adapter: str | None
    user: str | None
    opted_in: bool | None
    experiment: int | None
    arm: str | None
    version: int | None
    model: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Assignment:
        return from_fields(cls, data)


@dataclass
class Holdout:
    """An adapter's holdout: the ``share`` of its opted-in users kept on the base model across
    promotions, the lineage's cumulative lift against them (``latest``: ``computed_at``, ``users``,
    ``analysis``, with the holdout as control; None before the first computation) and the
    ``alarms`` raised on promoted versions in the last 7 days (each a dict: version, metric,
    reference, observed, reference_value, relative_change, reason, rolled_back, created_at), and
    the ``watch``: the latest alarm check of the production version while its promotion (last 7
    days) is watched (version, promoted_at, reference, checked_at, and ``metrics``, each with a
    ``status``: alarm, no_alarm, too_few_users, too_few_effective_users or not_testable, and its
    ``reason``); None when no promotion is watched."""

    adapter: str
    share: float
    latest: dict[str, Any] | None
    alarms: list[dict[str, Any]]
    watch: dict[str, Any] | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Holdout:
        return from_fields(cls, data)
