"""Typed results of the tenant's own calls: the tenant and its settings, API keys, the audit
log, end users (cohorts), models and the health check. Lenient, as in ``_types``: a field the
server adds later is ignored, one it leaves out is None, and ``raw`` keeps the whole object."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from strop._literals import Scope
from strop._types import from_fields, parse_datetime, text_or_none

__all__ = ["ApiKey", "AuditEvent", "EndUser", "Health", "Model", "Tenant"]


@dataclass
class EndUser:
    """An end user of the tenant (by the tenant's own id) and their opt-in state:
    ``opted_in_changed_at`` is when that state was last set, ``created_at`` when Strop first heard
    of them. ``users.get`` answers more (their consent history, exposures, recent interactions):
    those are in ``raw``."""

    end_user_id: str
    opted_in: bool
    opted_in_changed_at: datetime | None = None
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def updated_at(self) -> datetime | None:
        """The earlier name of :attr:`opted_in_changed_at`."""
        return self.opted_in_changed_at

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EndUser:
        return cls(
            end_user_id=str(data.get("end_user_id") or data.get("id") or ""),
            opted_in=bool(data.get("opted_in")),
            opted_in_changed_at=parse_datetime(data.get("opted_in_changed_at")),
            created_at=parse_datetime(data.get("created_at")),
            raw=data,
        )


@dataclass
class Model:
    """A model name the completion endpoints accept (one per adapter of the tenant): OpenAI's
    model shape, with ``root`` the base model the adapter is trained on."""

    id: str
    created: int | None = None
    owned_by: str | None = None
    root: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Model:
        return cls(
            id=str(data.get("id") or data.get("name") or ""),
            created=data.get("created"),
            owned_by=text_or_none(data, "owned_by"),
            root=text_or_none(data, "root"),
            raw=data,
        )


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


@dataclass
class Tenant:
    """The tenant a key belongs to and its settings. ``key`` is the calling key (its scopes...),
    in the answer to ``tenant.get`` only."""

    slug: str
    name: str
    rate_limit_per_minute: int | None
    accept_pending_feedback: bool | None
    default_opt_in: bool | None
    experiment_auto_promote: bool | None
    experiment_auto_rollback: bool | None
    retention_days: int | None
    created_at: datetime | None
    key: ApiKey | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Tenant:
        return from_fields(cls, data, created_at=parse_datetime, key=ApiKey.from_json)


@dataclass
class AuditEvent:
    """One entry of the tenant's audit log: who (``actor``: a key or a dashboard user) did what
    (``action``, e.g. ``experiment.start``) to which object, with the details in ``data``."""

    id: int
    actor: str
    action: str
    target_type: str | None
    target_id: str | None
    data: dict[str, Any] | None
    created_at: datetime | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> AuditEvent:
        return from_fields(cls, data, created_at=parse_datetime)


@dataclass
class Health:
    """The API's liveness: ``status`` "ok" and the database it reached."""

    status: str
    database: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Health:
        return from_fields(cls, data)
