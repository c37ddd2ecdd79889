"""Typed results of the adapter and training calls: adapters and their versions, the training
policy, training runs and the eval set. Lenient, as in ``_types``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from strop._types import from_fields, parse_datetime

__all__ = ["Adapter", "AdapterVersion", "EvalSet", "TrainingPolicy", "TrainingRun"]


@dataclass
class Adapter:
    """A tenant adapter and the version number serving it in production (None: the base model)."""

    name: str
    base_model: str | None
    is_default: bool | None
    production_version: int | None
    created_at: datetime | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Adapter:
        return from_fields(cls, data, created_at=parse_datetime)


@dataclass
class AdapterVersion:
    """One trained version of an adapter. ``status``: ``training``, ``candidate`` (passed the
    gate), ``in_experiment``, ``production``, ``retired``, ``failed`` (``status_message`` says
    why) or ``purged`` (its weights deleted: it learned from an erased end user; ``purged_at``).
    ``vllm_name`` is the model name vLLM serves it under (a completion's ``strop.version``);
    ``parent`` the version it was trained from (None: the base model); ``metrics`` the trainer's
    and the gate's figures; ``offline_eval`` the gate's evaluation of it on the adapter's eval set
    (None without one): ``cases``, ``eval_set``, ``check`` (the gate's FIM check: ``passed``,
    ``failed`` or ``skipped``), ``rule`` (how it decided: ``paired`` or ``margin``), and for
    ``base`` (None where the parent is the base model), ``parent``, ``candidate`` and ``lift``
    (candidate − parent, paired by case) the figures ``first_line_match``, ``exact_match`` and
    ``edit_similarity``, each ``{"value", "low", "high", "n"}`` with its 95 % interval;
    ``loaded_at`` when vLLM loaded it."""

    number: int
    vllm_name: str | None
    status: str | None
    status_message: str | None
    parent: int | None
    lora_rank: int | None
    metrics: dict[str, Any] | None
    show_gate: dict[str, Any] | None
    created_at: datetime | None
    loaded_at: datetime | None
    purged_at: datetime | None = None
    offline_eval: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> AdapterVersion:
        return from_fields(cls, data, created_at=parse_datetime, loaded_at=parse_datetime, purged_at=parse_datetime)


@dataclass
class TrainingPolicy:
    """When an adapter trains (``enabled``, after ``min_new_events`` labelled events or
    ``max_wait_s``), on what reward (one ``reward_<outcome>`` per feedback outcome), what share
    is held out for the gate, whether a candidate starts an experiment by itself, the show gate
    (which suggestions are worth showing), and the trainer's and the gate's overrides;
    ``override_limits`` lists every key those overrides may hold, with its range."""

    enabled: bool | None
    min_new_events: int | None
    max_wait_s: int | None
    heldout_fraction: float | None
    reward_accepted: float | None
    reward_rejected: float | None
    reward_not_shown: float | None
    reward_edited: float | None
    reward_partial: float | None
    reward_thumbs_up: float | None
    reward_thumbs_down: float | None
    reward_edit_persisted: float | None
    reward_edit_reverted: float | None
    reward_follow_up_dissatisfied: float | None
    reward_tool_call_failed: float | None
    auto_experiment: bool | None
    credit_retained: bool | None
    show_gate: bool | None
    show_gate_recall: float | None
    show_gate_explore: float | None
    trainer_overrides: dict[str, Any] | None
    gate_overrides: dict[str, Any] | None
    override_limits: dict[str, Any] | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> TrainingPolicy:
        return from_fields(cls, data)


@dataclass
class TrainingRun:
    """One training run of an adapter: ``queued`` → ``exporting`` → ``training`` →
    ``evaluating`` → ``candidate`` (passed the gate: ``output_version`` is the new version) |
    ``rejected`` (the gate said no: ``gate["reasons"]``) | ``failed`` (``error``). ``window_size``
    events trained, ``heldout_size`` held out; ``stage_seconds`` per stage; ``trainer_summary``
    the trainer's figures; ``erased_users`` end users erased while their events were in its
    window; ``window_excluded_at`` / ``window_excluded_by``: when and by whom a rejected run's
    events were left out of training."""

    id: int
    adapter: str | None
    status: str
    attempt: int | None
    trigger: str | None
    parent_version: int | None
    output_version: int | None
    window_size: int | None
    heldout_size: int | None
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    stage_seconds: dict[str, float] | None
    trainer_summary: dict[str, Any] | None
    gate: dict[str, Any] | None
    log: Any
    error: str | None
    erased_users: int | None
    window_excluded_at: datetime | None = None
    window_excluded_by: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> TrainingRun:
        dates = dict.fromkeys(
            ("created_at", "started_at", "finished_at", "heartbeat_at", "window_excluded_at"), parse_datetime
        )
        return from_fields(cls, data, **dates)


@dataclass
class EvalSet:
    """The eval set just uploaded: how many ``cases``, and when."""

    cases: int
    uploaded_at: datetime | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> EvalSet:
        return from_fields(cls, data, uploaded_at=parse_datetime)
