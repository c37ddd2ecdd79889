"""Ctrl-C stops every process `make demo` started, a Celery worker whose warm shutdown would wait
included. The demo's own start and stop functions (platform/demo-processes.sh, which demo.sh
sources) start the API and the three workers on the embedded default, in a temporary folder; vLLM is
left out (minutes to start, and stopped the same way). A process that ignores SIGTERM stands for
a worker waiting for its running task: only the SIGKILL after the grace period stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from benchmarks.common import free_port
from tests.fixtures.services import REPO_ROOT, tail
from tests.fixtures.workers import wait_until

pytestmark = pytest.mark.slow

GRACE_S = 3

DRIVER = """
set -euo pipefail
cd "$REPO_ROOT"
source platform/demo-processes.sh
demo_start_api "$PORT"
demo_start_workers
demo_spawn stubborn bash -c 'trap "" TERM; while :; do sleep 1; done'
wait
"""


def _groups_alive(pgids: set[int]) -> list[psutil.Process]:
    alive = []
    for proc in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getpgid(proc.pid) in pgids and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


def test_ctrl_c_stops_every_process_the_demo_started(tmp_path: Path):
    import httpx

    port = free_port()
    log_dir = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
    env.update(
        REPO_ROOT=str(REPO_ROOT),
        PORT=str(port),
        STROP_VAR_DIR=str(tmp_path / "var"),  # the embedded default's SQLite and broker, not the repo's var/
        DEMO_LOG_DIR=str(log_dir),
        DEMO_STOP_GRACE_S=str(GRACE_S),
    )
    script = tmp_path / "demo-start.sh"
    script.write_text(DRIVER)
    driver = subprocess.Popen(
        ["bash", str(script)],
        env=env,
        cwd=REPO_ROOT,
        stdout=(tmp_path / "driver.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: the terminal's foreground group, which Ctrl-C signals
        # A shell started from a terminal takes SIGINT. One that inherits it ignored (pytest launched
        # in the background of a script, as `cmd &` does) could not trap it: restore the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pgids: set[int] = set()
    try:

        def started() -> bool:
            assert driver.poll() is None, tail(tmp_path / "driver.log")
            logs = [log_dir / f"{name}.log" for name in ("worker-default", "worker-webhooks", "worker-gpu")]
            if not all(path.exists() and "ready." in path.read_text(errors="replace") for path in logs):
                return False
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(started, timeout=300, what="the demo's API and workers to start")
        children = psutil.Process(driver.pid).children()
        pgids = {child.pid for child in children}
        assert len(pgids) == 5, [c.cmdline() for c in children]  # api, three workers, the stubborn one
        assert all(os.getpgid(pid) == pid for pid in pgids)  # each leads a group of its own
        started_procs = _groups_alive(pgids)
        assert len(started_procs) > 4  # gunicorn's workers, the stubborn one's sleep, ...

        began = time.monotonic()
        os.killpg(driver.pid, signal.SIGINT)  # Ctrl-C
        code = driver.wait(timeout=GRACE_S + 120)
        took = time.monotonic() - began
        survivors = _groups_alive(pgids)
        assert not survivors, [(p.pid, p.info["cmdline"]) for p in survivors]
        assert code == 130, (code, tail(tmp_path / "driver.log"))
        assert took < GRACE_S + 60, f"stopping took {took:.0f} s"
        assert "SIGKILL" in tail(tmp_path / "driver.log")  # the stubborn one needed it
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        for proc in _groups_alive(pgids):
            proc.kill()
