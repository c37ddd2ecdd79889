"""Reading settings from the environment: booleans, integers, lists, http(s) URLs and a database URL as
Django's dict. A value that cannot be right stops the settings from loading with a ValueError that
names the variable and the value."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse, urlsplit


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


def env_http_urls(name: str, default: str) -> list[str]:
    """A comma-separated list of base URLs, at least one, each ``http://`` or ``https://`` with a host
    and, when it names one, a port from 1 to 65535: a wrong item is refused when the settings load,
    not at the first request that uses it."""
    urls = env_list(name, default)
    if not urls:
        raise ValueError(f"{name} is empty: give at least one http(s) URL, e.g. {default.split(',')[0]}")
    for url in urls:
        parts = urlsplit(url)
        try:
            port = parts.port  # a port that is not a number, or past 65535, raises
        except ValueError:
            port = 0
        if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
            raise ValueError(
                f"{name}: {url!r} is not an http(s) URL with a host and a valid port (1-65535), e.g. http://vllm:8100"
            )
    return urls


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
