"""Deterministic assignment: hash(salt, external user id) into 10,000 buckets, weighted arms.

The salt is fixed when an experiment starts, so a user's arm never moves while it runs, in any
process, after any restart; a new experiment (new salt) reshuffles users independently.
"""

from __future__ import annotations

import hashlib

BUCKETS = 10_000
CONTROL, CANDIDATE = "control", "candidate"
ARMS = (CONTROL, CANDIDATE)


def bucket_of(salt: str, external_id: str) -> int:
    digest = hashlib.sha256(f"{salt}:{external_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def assign_arm(salt: str, external_id: str, *, candidate_weight: float) -> str:
    """``candidate`` for the first ``candidate_weight`` share of the buckets, else ``control``."""
    return CANDIDATE if bucket_of(salt, external_id) < round(candidate_weight * BUCKETS) else CONTROL
