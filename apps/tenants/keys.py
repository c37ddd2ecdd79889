"""API key format and hashing.

A key looks like ``strop_<prefix>_<secret>``. The prefix (public, unique) finds the row in
one indexed lookup; the whole key is checked against an HMAC-SHA256 keyed with a server-side
pepper. A fast keyed hash is right here: keys are long random strings, not passwords.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.conf import settings

KEY_PREFIX = "strop"
_PREFIX_BYTES = 6
_SECRET_BYTES = 24


@dataclass(frozen=True)
class ParsedKey:
    prefix: str
    raw: str


def generate_key() -> ParsedKey:
    prefix = secrets.token_hex(_PREFIX_BYTES)
    secret = secrets.token_urlsafe(_SECRET_BYTES)
    return ParsedKey(prefix=prefix, raw=f"{KEY_PREFIX}_{prefix}_{secret}")


def parse_key(raw: str) -> ParsedKey | None:
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or len(parts[1]) != 2 * _PREFIX_BYTES or not parts[2]:
        return None
    return ParsedKey(prefix=parts[1], raw=raw)


def hash_key(raw: str) -> str:
    return hmac.new(settings.API_KEY_PEPPER.encode(), raw.encode(), hashlib.sha256).hexdigest()


def key_matches(raw: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_key(raw), stored_hash)
