"""Reading settings from the environment: booleans, integers, lists and a database URL as Django's dict."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int, *, minimum: int | None = None, hint: str = "") -> int:
    """An integer setting; below ``minimum`` it stops the settings from loading, saying ``hint``."""
    value = os.environ.get(name)
    number = default if value in (None, "") else int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name}={number}: {hint or f'at least {minimum}'}")
    return number


def env_list(name: str, default: str = "") -> list[str]:
    """A comma-separated setting: its items, stripped, the empty ones left out."""
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def database_from_url(url: str) -> dict[str, object]:
    """Turn ``postgres://user:pass@host:port/name`` or ``sqlite:///path`` into Django's dict."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        # The API and the workers are separate processes: WAL lets readers run beside the one
        # writer, and IMMEDIATE transactions wait for the lock instead of failing mid-way.
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": parsed.path or ":memory:",
            "OPTIONS": {"timeout": 30, "init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE"},
        }
    if parsed.scheme in {"postgres", "postgresql"}:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            "CONN_MAX_AGE": env_int("DATABASE_CONN_MAX_AGE", 60),
            # A health check is one more round trip at the start of every request; a dropped
            # connection fails one request instead and is replaced.
            "CONN_HEALTH_CHECKS": env_bool("DATABASE_CONN_HEALTH_CHECKS", False),
            # The hot paths' plain statements (apps.common.lookups.prepared_cursor) are prepared
            # on their connection at their second use, so Postgres stops planning them on every
            # request. 0 turns it off: behind a PgBouncer in transaction mode older than 1.21 a
            # prepared statement does not follow the client to the next server connection.
            "OPTIONS": {"prepare_threshold": 1 if env_bool("DATABASE_PREPARED_STATEMENTS", True) else None},
        }
    raise ValueError(f"DATABASE_URL scheme {parsed.scheme!r} is not supported (postgres or sqlite)")
