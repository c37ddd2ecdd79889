"""Every secret Strop or its replicas read, checked one way, and the deployment's mail.

``SECRETS`` is the table: one line per secret, its minimum length and when a missing one refuses
start-up. ``check_deployment`` runs at the end of the settings: with ``DEBUG`` off, a secret that is
set but short, a placeholder, a value published in this repository (``platform/env.example``,
``platform/compose.env.example``, the test suite's former fixed secrets) or too uniform stops every
process with one error that names each setting; a missing one does too where its line says so. A
deployment (``DEBUG`` off and ``DATABASE_URL`` set) must also send password-reset mail: a backend that
prints, keeps or drops it is refused.

``SECRET_KEY`` and ``API_KEY_PEPPER`` (and ``ERASURE_MARK_KEY``, ``STORED_SECRETS_KEY``) are generated once
when unset on the embedded default (no ``DATABASE_URL``) and under ``DEBUG``: into a file of their own under ``VAR_DIR``
(mode 0600), which every process of the machine then reads, so the API, the workers and ``manage.py``
agree on the keys, and they survive a restart.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

# Django's own bar for SECRET_KEY (security.W009 asks for 50 characters): Strop's signing keys.
MIN_LENGTH = 50
# Fewer distinct characters than this (or than half the minimum length, for the shorter kinds) is a
# typed pattern ("abababab..."), not a generated value.
MIN_DISTINCT_CHARACTERS = 10
# Words that mark a value copied from an example rather than generated (env.example ships change-me);
# strop-test marks the test suite's former fixed secrets and its object store's credentials.
PLACEHOLDER_MARKERS = (
    "change-me",
    "changeme",
    "change_me",
    "replace-me",
    "replace_me",
    "placeholder",
    "example",
    "insecure",
    "not-for-production",
    "django-insecure-",
    "strop-test",
)
# Files of this repository whose values are public: any secret equal to one of them is refused.
PUBLISHED_IN = ("platform/env.example", "platform/compose.env.example")
HOW_TO_GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(50))'"

Settings = Mapping[str, Any]


def always(settings: Settings) -> bool:
    """Required whenever the process is deployed."""
    return True


def never(settings: Settings) -> bool:
    """Optional: checked only when set."""
    return False


def with_setting(*names: str) -> Callable[[Settings], bool]:
    """Required when each of ``names`` is set (e.g. a store secret once a store key id is given)."""
    return lambda settings: all(settings.get(name) for name in names)


@dataclass(frozen=True)
class Secret:
    setting: str  # what the operator sets, and the error names
    min_length: int
    required: Callable[[Settings], bool]  # when deployed, whether a missing value refuses start-up
    part: str = ""  # "password": the password inside the setting's URL
    hint: str = ""  # added to "is not set"

    @property
    def label(self) -> str:
        return f"the password in {self.setting}" if self.part else self.setting

    def value(self, settings: Settings) -> str:
        raw = str(settings.get(self.setting) or "")
        if self.part == "password":
            return unquote(urlparse(raw).password or "") if "://" in raw else ""
        return raw.strip()


# The table. A setting that is not in the settings at all is skipped (a line may name one that only
# some versions read); one that is set is always checked. Adding a secret is adding a line.
SECRETS: tuple[Secret, ...] = (
    Secret("SECRET_KEY", MIN_LENGTH, always),
    Secret(
        "API_KEY_PEPPER",
        MIN_LENGTH,
        always,
        hint=" (it no longer falls back to SECRET_KEY: to keep the API keys issued so far, set it to "
        "the SECRET_KEY they were issued under, and give SECRET_KEY a new value)",
    ),
    Secret(
        "ERASURE_MARK_KEY",
        MIN_LENGTH,
        always,
        hint=" (erasure marks no longer use SECRET_KEY: to keep the marks made so far, set it to the "
        "SECRET_KEY they were made under)",
    ),
    Secret(
        "STORED_SECRETS_KEY",
        MIN_LENGTH,
        always,
        hint=" (it encrypts the webhook signing secrets Strop stores; the upgrade that added it seals "
        "the existing ones with it, so set it before migrating)",
    ),
    # Strop and every vLLM replica: a replica reachable without it loads and serves any adapter.
    Secret("VLLM_API_KEY", 32, always),
    # GET /metrics: without a token only loopback callers are served, so it may stay unset.
    Secret("STROP_METRICS_TOKEN", 32, never),
    # The adapter store: with a key id the secret goes with it; with neither, the host's own role.
    Secret("AWS_SECRET_ACCESS_KEY", 24, with_setting("STROP_ADAPTER_STORE", "AWS_ACCESS_KEY_ID")),
    # The adapter store's purge key (the API alone holds it): with its id, its secret.
    Secret("STROP_STORE_PURGE_SECRET", 24, with_setting("STROP_STORE_PURGE_KEY_ID")),
    # Postgres may authenticate otherwise (peer, client certificate, PGPASSWORD), so a URL without a
    # password is allowed; one with a password must hold a real one. The same for Redis.
    Secret("DATABASE_URL", 24, never, part="password"),
    Secret("REDIS_URL", 24, never, part="password"),
    Secret("CELERY_BROKER_URL", 24, never, part="password"),
    # SMTP: provider-issued passwords (app passwords) can be 16 characters.
    Secret("EMAIL_HOST_PASSWORD", 16, with_setting("EMAIL_HOST_USER")),
)
# The secrets Strop can generate for itself when not deployed (config/settings.py's load_secrets).
GENERATED = ("SECRET_KEY", "API_KEY_PEPPER", "ERASURE_MARK_KEY", "STORED_SECRETS_KEY")

# Mail backends that print, keep or drop a message instead of sending it: a reset link printed to a
# container's log is a password for whoever reads the logs.
NON_DELIVERING_MAIL = {
    "django.core.mail.backends.console.EmailBackend": "prints every message, reset links included, to the log",
    "django.core.mail.backends.filebased.EmailBackend": "writes every message, reset links included, to files",
    "django.core.mail.backends.locmem.EmailBackend": "keeps every message in memory and sends none",
    "django.core.mail.backends.dummy.EmailBackend": "drops every message",
}


def published_values(root: Path) -> frozenset[str]:
    """Every value (and every URL's password) written in the repository's example settings."""
    found: set[str] = set()
    for relative in PUBLISHED_IN:
        path = root / relative
        if not path.is_file():
            continue
        for match in re.finditer(r"^#?\s?[A-Z][A-Z0-9_]*=(.+)$", path.read_text(), re.MULTILINE):
            value = match.group(1).strip()
            found.add(value)
            if "://" in value and urlparse(value).password:
                found.add(unquote(urlparse(value).password or ""))
    return frozenset(value for value in found if value)


def weakness(value: str, min_length: int = MIN_LENGTH, published: frozenset[str] = frozenset()) -> str | None:
    """Why ``value`` is no real secret, or None when it looks like one."""
    lowered = value.lower()
    marker = next((m for m in PLACEHOLDER_MARKERS if m in lowered), None)
    if marker is not None:
        return f"it is a placeholder (contains {marker!r})"
    if value in published:
        return "it is a value published in this repository's example settings"
    if len(value) < min_length:
        return f"it has {len(value)} characters, fewer than {min_length}"
    distinct = min(MIN_DISTINCT_CHARACTERS, min_length // 2)
    if len(set(value)) < distinct:
        return f"it has fewer than {distinct} distinct characters"
    return None


def secret_problems(settings: Settings, *, deployed: bool, published: frozenset[str]) -> list[str]:
    """What is wrong with each secret of ``SECRETS`` that ``settings`` holds (DEBUG off)."""
    problems = []
    urls_checked: set[str] = set()
    for secret in SECRETS:
        if secret.setting not in settings:
            continue
        if secret.part:  # CELERY_BROKER_URL defaults to REDIS_URL: one password, named once
            if settings[secret.setting] in urls_checked:
                continue
            urls_checked.add(settings[secret.setting])
        value = secret.value(settings)
        if not value:
            if deployed and secret.required(settings):
                problems.append(f"{secret.label} is not set{secret.hint}")
            continue
        reason = weakness(value, secret.min_length, published)
        if reason is not None:
            problems.append(f"{secret.label} is not a real secret: {reason}")
    return problems


def mail_problems(settings: Settings) -> list[str]:
    """A deployment sends password-reset mail: refuse a backend that would not (DEBUG off)."""
    backend = str(settings.get("EMAIL_BACKEND", ""))
    why = NON_DELIVERING_MAIL.get(backend)
    if why is None:
        return []
    return [
        f"EMAIL_BACKEND is {backend.rsplit('.', 2)[-2]}, which {why}: with DEBUG off, password-reset mail must be "
        "sent; set EMAIL_HOST (and EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS) for SMTP"
    ]


def check_deployment(settings: Settings, *, deployed: bool, debug: bool, root: Path) -> None:
    """Refuse to start (one error naming every problem) when a secret is weak or missing, or when a
    deployment cannot send mail. Nothing is checked under ``DEBUG``."""
    if debug:
        return
    problems = secret_problems(settings, deployed=deployed, published=published_values(root))
    if deployed:
        problems += mail_problems(settings)
    if problems:
        raise ImproperlyConfigured(
            "; ".join(problems) + ". With DEBUG off, Strop needs each secret set to a long random value of its "
            f"own (at least {MIN_LENGTH} characters for SECRET_KEY and API_KEY_PEPPER), for instance from "
            f"`{HOW_TO_GENERATE}` (platform/env.example lists them; docs/security.md)."
        )


def generated_secret(path: Path) -> str:
    """The secret stored at ``path``, written there first (random, mode 0600) if there is none.

    Processes that start together race to write it: each writes a whole file of its own and links
    it into place, so the first link wins and everyone reads that one, never a half-written file.
    """
    if not path.exists():
        descriptor, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # created 0600
        try:
            with os.fdopen(descriptor, "w") as scratch_file:
                scratch_file.write(secrets.token_urlsafe(MIN_LENGTH) + "\n")
            try:
                os.link(scratch, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(scratch)
    value = path.read_text().strip()
    if not value:
        raise ImproperlyConfigured(f"{path} is empty: delete it and Strop writes a new secret there")
    return value


def load_secrets(names: tuple[str, ...], *, deployed: bool, var_dir: Path) -> dict[str, str]:
    """Each setting in ``names``: the environment's value; when unset, generated under ``var_dir``
    unless ``deployed``, where it stays empty and ``check_deployment`` names it."""
    values: dict[str, str] = {}
    for name in names:
        value = os.environ.get(name, "").strip()
        if not value and not deployed:
            value = generated_secret(var_dir / name.lower())
        values[name] = value
    return values
