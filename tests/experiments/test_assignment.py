"""Assignment: deterministic, weighted, independent of the process that computes it."""

from __future__ import annotations

import subprocess
import sys

from apps.experiments.assignment import BUCKETS, assign_arm, bucket_of


def test_the_same_user_gets_the_same_arm_in_another_process():
    users = [f"user-{n}" for n in range(200)]
    here = [assign_arm("salt-1", u, candidate_weight=0.3) for u in users]
    code = (
        "from apps.experiments.assignment import assign_arm;"
        "print(','.join(assign_arm('salt-1', f'user-{n}', candidate_weight=0.3) for n in range(200)))"
    )
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert there.split(",") == here


def test_weights_split_users_in_proportion():
    users = [f"u{n}" for n in range(20_000)]
    share = sum(assign_arm("salt", u, candidate_weight=0.2) == "candidate" for u in users) / len(users)
    # Binomial(20000, 0.2): sd 0.0028; six of them leaves no room for luck.
    assert abs(share - 0.2) < 6 * (0.2 * 0.8 / len(users)) ** 0.5


def test_a_new_salt_reshuffles_users():
    users = [f"u{n}" for n in range(2_000)]
    same = sum(assign_arm("a", u, candidate_weight=0.5) == assign_arm("b", u, candidate_weight=0.5) for u in users)
    assert abs(same / len(users) - 0.5) < 6 * (0.25 / len(users)) ** 0.5
    assert all(0 <= bucket_of("a", u) < BUCKETS for u in users)
