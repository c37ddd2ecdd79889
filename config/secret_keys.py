"""The settings' secrets (``SECRET_KEY``, ``API_KEY_PEPPER``, ``ERASURE_MARK_KEY``): from the environment,
or generated once.

A deployment (``DEBUG`` off and ``DATABASE_URL`` set) must set each one to a long random value; a
missing, short or placeholder value stops every process at start with an error naming the setting.
The embedded default (no ``DATABASE_URL``) and ``DEBUG`` generate what is not set once, into a file
of its own under ``VAR_DIR`` (mode 0600), which every process of the machine then reads: the API, the
workers and ``manage.py`` agree on the keys, and they survive a restart.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

# Django's own bar for SECRET_KEY (security.W009 asks for 50 characters), for both.
MIN_LENGTH = 50
MIN_DISTINCT_CHARACTERS = 10
# Words that mark a value copied from an example rather than generated (env.example ships change-me).
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
)
HOW_TO_GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
# What an operator upgrading needs to know about a missing one.
MISSING_HINTS = {
    "API_KEY_PEPPER": " (it no longer falls back to SECRET_KEY: to keep the API keys issued so far, set it to "
    "the SECRET_KEY they were issued under, and give SECRET_KEY a new value)",
    "ERASURE_MARK_KEY": " (erasure marks no longer use SECRET_KEY: to keep the marks made so far, set it to the "
    "SECRET_KEY they were made under)",
}


def weakness(value: str) -> str | None:
    """Why ``value`` is no real secret, or None when it looks like one."""
    lowered = value.lower()
    marker = next((m for m in PLACEHOLDER_MARKERS if m in lowered), None)
    if marker is not None:
        return f"it is a placeholder (contains {marker!r})"
    if len(value) < MIN_LENGTH:
        return f"it has {len(value)} characters, fewer than {MIN_LENGTH}"
    if len(set(value)) < MIN_DISTINCT_CHARACTERS:
        return f"it has fewer than {MIN_DISTINCT_CHARACTERS} distinct characters"
    return None


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


def load_secrets(names: tuple[str, ...], *, deployed: bool, debug: bool, var_dir: Path) -> dict[str, str]:
    """Each setting in ``names``: the environment's value, checked when ``DEBUG`` is off; when unset,
    generated under ``var_dir`` unless ``deployed``, where it is an error. Every problem is named in
    one error, so an operator fixes them all at once."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for name in names:
        value = os.environ.get(name, "").strip()
        if not value:
            if deployed:
                problems.append(f"{name} is not set{MISSING_HINTS.get(name, '')}")
            else:
                values[name] = generated_secret(var_dir / name.lower())
            continue
        reason = None if debug else weakness(value)
        if reason is not None:
            problems.append(f"{name} is not a real secret: {reason}")
        values[name] = value
    if problems:
        raise ImproperlyConfigured(
            "; ".join(problems) + ". With DEBUG off, Strop needs each of these set to a long random value "
            f"of its own (at least {MIN_LENGTH} characters), for instance from `{HOW_TO_GENERATE}`"
            " (platform/env.example lists them)."
        )
    return values
