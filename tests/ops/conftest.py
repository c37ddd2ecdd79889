"""Operating several processes of a kind: real ``celery beat`` processes beside the workers of
``tests.fixtures.workers``, and reading ``/metrics`` back."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# What Celery's beat logs each time it sends a task (celery.beat.Scheduler.apply_entry).
SENT = "Sending due task "


@dataclass
class Beats:
    """``celery -A config beat`` processes, each with its own schedule file, log and node name."""

    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.log_dir / f"beat-{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "config",
                    "beat",
                    "-s",
                    str(self.log_dir / f"beat-{name}-schedule"),
                    "-n",
                    self.node_name(name),
                    "-l",
                    "info",
                ],
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    @staticmethod
    def node_name(name: str) -> str:
        """Its ``-n``; Celery expands ``%h`` to this host's name (``seen_name``)."""
        return f"beat-{name}-{os.getpid()}@%h"

    @classmethod
    def seen_name(cls, name: str) -> str:
        return cls.node_name(name).replace("%h", socket.gethostname())

    def log(self, name: str) -> str:
        path = self.log_dir / f"beat-{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def sent(self, name: str, entry: str = "") -> int:
        """How many tasks beat ``name`` has sent (of the schedule's ``entry`` if given)."""
        return self.log(name).count(SENT + entry)

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash or the OOM killer would: no cleanup runs."""
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self, name: str) -> int:
        """SIGTERM, as a supervisor stops it; its exit status."""
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=60)

    def stop_all(self) -> None:
        for name in list(self.procs):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def logs(self) -> str:
        return "\n".join(f"--- beat {name}\n{self.log(name)[-4000:]}" for name in sorted(self._names()))

    def _names(self) -> set[str]:
        return {path.name.removeprefix("beat-").removesuffix(".log") for path in self.log_dir.glob("beat-*.log")}


@pytest.fixture
def beats(tmp_path: Path) -> Iterator[Beats]:
    started = Beats(log_dir=tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


def scrape(client: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``GET /metrics`` through Django's test client (a loopback caller): {(sample, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }
