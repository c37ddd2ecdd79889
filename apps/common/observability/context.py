"""The request id, tenant and Celery task of the work in progress, for logs and task headers.

Contextvars, so each gunicorn thread and each Celery task sees its own; whoever binds them
resets them with the token it got back, so a thread that serves the next request starts clean.
"""

from __future__ import annotations

import re
from contextvars import ContextVar, Token
from dataclasses import dataclass

# Letters, digits and ._:- only, at most 64: safe in a header, a log line and a message header.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")

request_id_var: ContextVar[str | None] = ContextVar("strop_request_id", default=None)
tenant_var: ContextVar[str | None] = ContextVar("strop_tenant", default=None)
task_var: ContextVar[tuple[str, str] | None] = ContextVar("strop_task", default=None)


def safe_request_id(value: object) -> str | None:
    """``value`` if it is a short token safe to echo and log; None otherwise."""
    return value if isinstance(value, str) and _SAFE_ID.fullmatch(value) else None


@dataclass(frozen=True)
class Bound:
    """What :func:`bind` replaced, to put back with :func:`unbind`."""

    request_id: Token[str | None]
    tenant: Token[str | None]
    task: Token[tuple[str, str] | None]


def bind(*, request_id: str | None, tenant: str | None = None, task: tuple[str, str] | None = None) -> Bound:
    """Start a unit of work (a request, a task): its id, its tenant when known, its task (name, id)."""
    return Bound(request_id_var.set(request_id), tenant_var.set(tenant), task_var.set(task))


def unbind(bound: Bound) -> None:
    task_var.reset(bound.task)
    tenant_var.reset(bound.tenant)
    request_id_var.reset(bound.request_id)


def bind_tenant(slug: str) -> None:
    """The request turned out to act for this tenant (set by API key authentication)."""
    tenant_var.set(slug)


def current_request_id() -> str | None:
    return request_id_var.get()


def current_tenant() -> str | None:
    return tenant_var.get()
