"""Beat schedules once however many beat processes run (workers/beat.py): real ``celery beat``
processes, a Redis of the test's own, and a schedule whose experiment snapshots are due every
second, so each beat's log counts what it sent."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.workers import wait_until
from workers.beat import LOCK_KEY

pytestmark = pytest.mark.slow

SNAPSHOTS = "experiment-snapshots"  # the entry STROP_EXPERIMENT_SNAPSHOT_S makes due every second


def _env(redis_url: str, *, ttl_s: int) -> dict[str, str]:
    return {
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "STROP_BEAT_LOCK_TTL_S": str(ttl_s),
        "STROP_EXPERIMENT_SNAPSHOT_S": "1",
    }


def _holder(private_redis) -> str:
    value = private_redis.client().get(LOCK_KEY)
    return value.decode() if value is not None else ""


def test_of_two_beats_only_the_lock_holder_sends_and_the_other_takes_over_after_the_ttl_when_it_dies(
    beats, private_redis
):
    env = _env(private_redis.url(), ttl_s=3)
    first = beats.start("first", env)
    wait_until(lambda: beats.sent("first", SNAPSHOTS) >= 2, timeout=180, what="the first beat to send")
    second = beats.start("second", env)
    wait_until(lambda: "standing by" in beats.log("second"), timeout=180, what="the second beat to stand by")

    sent_before = beats.sent("first", SNAPSHOTS)
    wait_until(lambda: beats.sent("first", SNAPSHOTS) >= sent_before + 5, timeout=120, what="the first beat to send on")
    assert beats.sent("second") == 0, beats.logs()
    assert beats.log("second").count("standing by") == 1  # said once, not at every check
    assert f":{first.pid}:" in _holder(private_redis)

    beats.kill("first")  # no cleanup: its key stays until the TTL lapses
    wait_until(lambda: beats.sent("second", SNAPSHOTS) >= 2, timeout=180, what="the second beat to take over")
    assert f":{second.pid}:" in _holder(private_redis)
    assert "holds the beat lock" in beats.log("second")


def test_a_beat_stopped_cleanly_gives_the_lock_up_at_once(beats, private_redis):
    """With a TTL of a minute, the standby takes over within a few seconds: the stopping beat deleted
    its own key (and only its own) instead of leaving it to lapse."""
    ttl_s = 60
    env = _env(private_redis.url(), ttl_s=ttl_s)
    first = beats.start("first", env)
    wait_until(lambda: beats.sent("first", SNAPSHOTS) >= 1, timeout=180, what="the first beat to send")
    second = beats.start("second", env)
    wait_until(lambda: "standing by" in beats.log("second"), timeout=180, what="the second beat to stand by")
    assert f":{first.pid}:" in _holder(private_redis)

    assert beats.stop("first") == 0
    assert f":{first.pid}:" not in _holder(private_redis)  # gone, or the second's already
    stopped = time.monotonic()
    wait_until(lambda: beats.sent("second", SNAPSHOTS) >= 1, timeout=180, what="the second beat to take over")
    assert time.monotonic() - stopped < ttl_s, "the standby waited for the TTL: the lock was not released"
    assert f":{second.pid}:" in _holder(private_redis)


def test_a_beat_whose_lock_was_taken_while_it_stalled_stops_sending(beats, private_redis):
    """The holder renews only its own token: once another process holds the key (the holder
    stalled past the TTL and the standby took it), the old holder stands by instead of renewing."""
    env = _env(private_redis.url(), ttl_s=3)
    beats.start("only", env)
    wait_until(lambda: beats.sent("only", SNAPSHOTS) >= 1, timeout=180, what="the beat to send")
    private_redis.client().set(LOCK_KEY, "another-host:1:feedface", px=600_000)
    wait_until(lambda: "lost the beat lock" in beats.log("only"), timeout=60, what="the beat to notice")
    sent = beats.sent("only", SNAPSHOTS)
    time.sleep(4)  # four more snapshots would be due
    assert beats.sent("only", SNAPSHOTS) == sent
    assert _holder(private_redis) == "another-host:1:feedface"


def test_without_redis_two_beats_share_a_file_lock_and_the_survivor_takes_over(beats, tmp_path):
    """The embedded default (no REDIS_URL, the filesystem broker): the lock is a file under VAR_DIR,
    released by the kernel the moment its holder dies."""
    env = {
        "REDIS_URL": "",
        "CELERY_BROKER_URL": "filesystem://",
        "STROP_VAR_DIR": str(tmp_path / "var"),
        "STROP_EXPERIMENT_SNAPSHOT_S": "1",
    }
    beats.start("first", env)
    wait_until(lambda: beats.sent("first", SNAPSHOTS) >= 2, timeout=180, what="the first beat to send")
    beats.start("second", env)
    wait_until(lambda: "standing by" in beats.log("second"), timeout=180, what="the second beat to stand by")
    sent_before = beats.sent("first", SNAPSHOTS)
    wait_until(lambda: beats.sent("first", SNAPSHOTS) >= sent_before + 3, timeout=120, what="the first beat to send on")
    assert beats.sent("second") == 0, beats.logs()
    assert (tmp_path / "var" / "celerybeat.lock").exists()

    beats.kill("first")
    wait_until(lambda: beats.sent("second", SNAPSHOTS) >= 2, timeout=180, what="the second beat to take over")
