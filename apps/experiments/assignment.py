"""Deterministic assignment: hash(salt, external user id) into 10,000 buckets, weighted arms.

The salt is fixed when an experiment starts, so a user's arm never moves while it runs, in any
process, after any restart; a new experiment (new salt) reshuffles users independently.

An adapter's holdout uses the same hash with a salt of the adapter's own, which no promotion or
experiment changes: its users stay on the base model for the adapter's whole lineage, and
raising the share only adds users to it (the first buckets are the holdout).
"""

from __future__ import annotations

import hashlib

BUCKETS = 10_000
CONTROL, CANDIDATE = "control", "candidate"
ARMS = (CONTROL, CANDIDATE)
HOLDOUT = "holdout"
"""The arm a served interaction records for a user of the adapter's holdout (no experiment)."""


def bucket_of(salt: str, external_id: str) -> int:
    digest = hashlib.sha256(f"{salt}:{external_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def assign_arm(salt: str, external_id: str, *, candidate_weight: float) -> str:
    """``candidate`` for the first ``candidate_weight`` share of the buckets, else ``control``."""
    return CANDIDATE if bucket_of(salt, external_id) < round(candidate_weight * BUCKETS) else CONTROL


def holdout_salt(adapter_id: int) -> str:
    return f"holdout:{adapter_id}"


def in_holdout(*, adapter_id: int, share: float, external_id: str) -> bool:
    """Whether an (opted-in) end user belongs to the adapter's holdout of ``share``; nobody at 0."""
    if share <= 0 or not external_id:
        return False
    return bucket_of(holdout_salt(adapter_id), external_id) < round(share * BUCKETS)
