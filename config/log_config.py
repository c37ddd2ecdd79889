"""The processes' logging (Django's LOGGING), built from the environment by config/settings.py.

- ``LOG_FORMAT``: one JSON object per line (``json``, the default) or text for a terminal
  (``plain``); every line carries the request id, which follows a request into the Celery tasks it
  enqueues.
- ``LOG_QUIET``: a person reads the console (`make up` sets it): routine lines (beat sending its
  periodic tasks, a worker receiving one and its success) stay off the console; ``LOG_FILE``, when
  set, still gets them.
- ``LOG_FILE``: also every line, as JSON, appended to this file (every process may share it: one
  write per line).
- ``LOG_LEVEL``: the root logger's level (``INFO``).
"""

from __future__ import annotations

import os
from typing import Any


def log_format() -> str:
    value = os.environ.get("LOG_FORMAT", "json")
    if value not in {"json", "plain"}:
        raise ValueError(f"LOG_FORMAT must be 'json' or 'plain', not {value!r}")
    return value


def logging_config(*, log_format: str, quiet: bool, log_file: str, level: str) -> dict[str, Any]:
    handlers: dict[str, dict[str, Any]] = {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": log_format,
            "filters": ["context", "routine"] if quiet else ["context"],
        },
    }
    if log_file:
        handlers["file"] = {
            "class": "logging.FileHandler",
            "filename": log_file,
            "formatter": "json",
            "filters": ["context"],
        }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "context": {"()": "apps.common.observability.logs.ContextFilter"},
            "routine": {"()": "apps.common.observability.logs.RoutineFilter"},
            # Paths redacted by route (no reset or invitation token, no end-user id): access-log rule.
            "redact_request_path": {"()": "apps.common.observability.redaction.RedactRequestPath"},
        },
        "formatters": {
            "json": {"()": "apps.common.observability.logs.JsonFormatter"},
            "plain": {"()": "apps.common.observability.logs.PlainFormatter"},
        },
        "handlers": handlers,
        "root": {"handlers": list(handlers), "level": level},
        "loggers": {
            "django.request": {"level": "ERROR", "filters": ["redact_request_path"]},
            "httpx": {"level": "WARNING"},
            # django-axes' "AXES: BEGIN ..." line, which every process (every manage.py command) would print.
            "axes.apps": {"level": "WARNING"},
        },
    }
