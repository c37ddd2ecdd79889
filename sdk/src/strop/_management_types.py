"""Typed results of the cohort, experiment, adapter and model calls (lenient, as in ``_types``:
their shapes are still growing, so each keeps the whole JSON object in ``raw``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from strop._literals import Scope
from strop._types import parse_datetime, text_or_none

__all__ = ["Adapter", "ApiKey", "Assignment", "EndUser", "Experiment", "Model"]


@dataclass
class EndUser:
    """An end user of the tenant (by the tenant's own id) and their opt-in state."""

    end_user_id: str
    opted_in: bool
    updated_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EndUser:
        return cls(
            end_user_id=str(data.get("end_user_id") or data.get("id") or ""),
            opted_in=bool(data.get("opted_in")),
            updated_at=parse_datetime(data.get("updated_at") or data.get("opted_in_at")),
            raw=data,
        )


@dataclass
class Experiment:
    """An A/B experiment of an adapter (control vs candidate on the opt-in cohort)."""

    id: str
    adapter: str | None
    status: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Experiment:
        return cls(
            id=str(data.get("id") or ""),
            adapter=text_or_none(data, "adapter"),
            status=text_or_none(data, "status"),
            raw=data,
        )


@dataclass
class Assignment:
    """Which arm (and adapter version) serves an end user of an adapter right now."""

    arm: str | None
    experiment_id: str | None
    version: Any
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Assignment:
        experiment = data.get("experiment")
        experiment_id = data.get("experiment_id")
        if experiment_id is None and isinstance(experiment, dict):
            experiment_id = experiment.get("id")
        elif experiment_id is None and experiment is not None:
            experiment_id = experiment
        return cls(
            arm=text_or_none(data, "arm"),
            experiment_id=None if experiment_id is None else str(experiment_id),
            version=data.get("version"),
            raw=data,
        )


@dataclass
class Adapter:
    """A tenant adapter and the version number serving it in production (None: the base model)."""

    name: str
    base_model: str | None
    is_default: bool
    production_version: int | None
    created_at: datetime | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Adapter:
        return cls(
            name=str(data.get("name") or ""),
            base_model=text_or_none(data, "base_model"),
            is_default=bool(data.get("is_default")),
            production_version=data.get("production_version"),
            created_at=parse_datetime(data.get("created_at")),
            raw=data,
        )


@dataclass
class Model:
    """A model name the completion endpoint accepts."""

    id: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Model:
        return cls(id=str(data.get("id") or data.get("name") or ""), raw=data)


@dataclass
class ApiKey:
    """An API key of the tenant. ``key``, the secret, is only in the answer to ``keys.create``:
    Strop keeps its hash alone. ``revoked_at`` is set once the key stops working."""

    id: int
    name: str
    prefix: str
    scopes: list[Scope]
    default_opt_in: bool | None
    created_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None
    key: str | None = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ApiKey:
        return cls(
            id=int(data.get("id") or 0),
            name=str(data.get("name") or ""),
            prefix=str(data.get("prefix") or ""),
            scopes=[cast(Scope, str(scope)) for scope in data.get("scopes") or []],
            default_opt_in=data.get("default_opt_in"),
            created_at=parse_datetime(data.get("created_at")),
            last_used_at=parse_datetime(data.get("last_used_at")),
            revoked_at=parse_datetime(data.get("revoked_at")),
            key=text_or_none(data, "key"),
            raw=data,
        )
