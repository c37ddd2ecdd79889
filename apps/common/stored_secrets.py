"""Secrets Strop keeps and must read back (a webhook's signing secret: it signs every delivery)
are stored encrypted, so a copy of the database (a backup, a replica, a dump) does not hold them.

AES-256-GCM under a key of their own, ``STORED_SECRETS_KEY`` (config/secret_keys.py: required when
deployed, generated under ``var/`` on the embedded default), through HKDF-SHA256; a fresh 96-bit
nonce per value, and the value's purpose (``"webhook.secret"``) as associated data, so a value
copied into a column of another kind does not open. A stored value reads
``v1:<key id>:<base64url(nonce + ciphertext)>``; the key id (8 hex characters, derived from the
setting apart from the key) says which key sealed it.

Rotation: put the old key in ``STORED_SECRETS_KEY_FALLBACKS`` (comma-separated) and the new one in
``STORED_SECRETS_KEY``; values open under either, and are sealed under the new one when next written
(``manage.py stored_secrets_reseal`` writes every one now). A value none of the keys opens (or a
malformed one) is :class:`Unreadable`: loading its row still works (the pages list it),
saving it writes back what was stored, using it fails with a message that says what to do. A value
stored in the clear (by a release before this one) is read as it is; ``stored_secrets_reseal``
seals it. ``dumpdata`` writes the sealed form, which ``loaddata`` stores as it is.
"""

from __future__ import annotations

import base64
import functools
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import models

VERSION = "v1"
_INFO = b"strop stored secrets v1"


class Unreadable(str):
    """A stored secret none of the configured keys opens: its text says why, ``stored`` is what the
    column holds (written back unchanged if its row is saved). Signing with it fails."""

    stored: str

    def __new__(cls, why: str, *, stored: str) -> Unreadable:
        value = super().__new__(cls, why)
        value.stored = stored
        return value

    def __getnewargs_ex__(self) -> tuple[tuple[str], dict[str, str]]:  # pickle and copy keep ``stored``
        return (str(self),), {"stored": self.stored}


class SecretUnreadable(ValueError):
    """A stored secret was needed and none of the configured keys opens it."""


@functools.cache
def _derived(key: str) -> tuple[str, AESGCM]:
    """(the key's id, its cipher): both derived from the setting, the id apart from the key."""
    material = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(key.encode())
    key_id = HKDF(algorithm=hashes.SHA256(), length=4, salt=None, info=_INFO + b" key id").derive(key.encode())
    return key_id.hex(), AESGCM(material)


def _keys() -> list[tuple[str, AESGCM]]:
    """The current key first, then the fallbacks; none when no key is set (a misconfigured process:
    start-up refuses it when deployed)."""
    names = [settings.STORED_SECRETS_KEY, *settings.STORED_SECRETS_KEY_FALLBACKS]
    return [_derived(key) for key in names if key]


def _current() -> tuple[str, AESGCM]:
    if not settings.STORED_SECRETS_KEY:
        raise SecretUnreadable("STORED_SECRETS_KEY is not set: Strop cannot store a secret")
    return _derived(settings.STORED_SECRETS_KEY)


def current_key_id() -> str:
    return _current()[0]


def sealed(plaintext: str, *, purpose: str) -> str:
    """``plaintext`` encrypted under the current key, as stored."""
    key_id, aead = _current()
    nonce = os.urandom(12)
    ciphertext = aead.encrypt(nonce, plaintext.encode(), purpose.encode())
    return f"{VERSION}:{key_id}:{base64.urlsafe_b64encode(nonce + ciphertext).decode()}"


def is_sealed(stored: str) -> bool:
    return stored.startswith(f"{VERSION}:")


def sealed_by(stored: str, key_id: str) -> bool:
    """Whether ``stored`` is sealed under the key ``key_id`` names."""
    return stored.startswith(f"{VERSION}:{key_id}:")


def opened(stored: str, *, purpose: str) -> str:
    """The plaintext of a stored value; a value stored before encryption (no ``v1:``) as it is; an
    :class:`Unreadable` when no configured key opens it."""
    if not is_sealed(stored):
        return stored
    _version, key_id, blob = (stored.split(":", 2) + ["", ""])[:3]
    for candidate, aead in _keys():
        if candidate != key_id:
            continue
        try:
            raw = base64.urlsafe_b64decode(blob.encode())
            return aead.decrypt(raw[:12], raw[12:], purpose.encode()).decode()
        except (InvalidTag, ValueError):
            break
    return Unreadable(
        f"a stored {purpose} sealed under key {key_id or '?'} opens under neither STORED_SECRETS_KEY nor "
        "STORED_SECRETS_KEY_FALLBACKS: set the key it was sealed under as a fallback, or give it a new "
        "value (for a webhook: rotate its secret)",
        stored=stored,
    )


def readable(value: str) -> str:
    """``value`` when it opened; :class:`SecretUnreadable` (saying why) when it did not."""
    if isinstance(value, Unreadable):
        raise SecretUnreadable(str(value))
    return value


class SealedTextField(models.TextField):
    """Text stored sealed: the model's attribute is the plaintext, the column holds it encrypted
    (empty stays empty; a value already sealed, as ``dumpdata`` writes it, is stored as it is). Never
    filter on it: each sealing draws a new nonce, so equal values differ."""

    def __init__(self, *args: Any, purpose: str, **kwargs: Any) -> None:
        self.purpose = purpose
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["purpose"] = self.purpose
        return name, path, args, kwargs

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> str | None:
        return None if value is None else opened(value, purpose=self.purpose)

    def get_prep_value(self, value: Any) -> Any:
        if isinstance(value, Unreadable):
            return value.stored  # never known here: what was stored goes back unchanged
        value = super().get_prep_value(value)
        return sealed(value, purpose=self.purpose) if value and not is_sealed(value) else value

    def value_to_string(self, obj: Any) -> str:
        """``dumpdata``: the sealed form, never the plaintext."""
        value = self.value_from_object(obj)
        return self.get_prep_value(value) or ""
