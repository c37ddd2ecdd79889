"""Log lines for operators: one JSON object per line (``LOG_FORMAT=json``) or plain text.

Every line carries the request id of the work in progress, its tenant when known, and in a
Celery task the task's name and id, so ``grep <request id>`` finds a request and the tasks it
caused across the API and worker logs.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import orjson

from apps.common.observability.context import request_id_var, task_var, tenant_var

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is kept.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "tenant",
    "task",
    "task_id",
    "context",
}


class ContextFilter(logging.Filter):
    """Copies the request id, tenant and task onto each record (a handler filter: it sees every
    record the handler writes, from any logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.tenant = tenant_var.get()
        task = task_var.get()
        record.task, record.task_id = task if task is not None else (None, None)
        return True


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", "request_id", ["tenant"], ["task", "task_id"],
    ["exception"], ...extra}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        for name in ("tenant", "task", "task_id"):
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for name, value in record.__dict__.items():
            if name not in _RECORD_ATTRS and name not in out:
                out[name] = value
        try:
            return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # e.g. an integer too large for JSON in an extra: never lose the line
            return orjson.dumps({k: v if isinstance(v, str | None) else repr(v) for k, v in out.items()}).decode()


class PlainFormatter(logging.Formatter):
    """``time LEVEL logger [request id]: message``, for reading on a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(context)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        parts = [getattr(record, "request_id", None), getattr(record, "tenant", None), getattr(record, "task", None)]
        shown = " ".join(p for p in parts if p)
        record.context = f" [{shown}]" if shown else ""
        return super().formatMessage(record)


# Celery's lines about the periodic tasks every idle deployment runs: beat sending one, a worker
# receiving it, its success. Warnings and errors from the same loggers (a task that failed) stay.
ROUTINE_LOGGERS = frozenset({"celery.beat", "celery.worker.strategy", "celery.app.trace"})


class RoutineFilter(logging.Filter):
    """Leaves routine lines (``ROUTINE_LOGGERS`` below WARNING) out of a handler meant for a person
    (``LOG_QUIET``); a handler without it, such as ``LOG_FILE``'s, still writes them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name not in ROUTINE_LOGGERS
