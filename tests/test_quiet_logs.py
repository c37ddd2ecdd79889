"""Logs a person reads: no library banner on each ``manage.py`` command, and under ``make up``
(``LOG_QUIET=1``) no routine Celery lines on the console, while ``LOG_FILE`` keeps every line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# One line from each routine logger, one failure from the same logger, and one of Strop's own.
LOG_SOME_LINES = """
import logging, django
django.setup()
logging.getLogger("celery.beat").info("Scheduler: Sending due task training-schedule")
logging.getLogger("celery.worker.strategy").info("Task workers.training.training_schedule_all[1] received")
logging.getLogger("celery.app.trace").info("Task workers.training.training_schedule_all[1] succeeded in 0.01s")
logging.getLogger("celery.app.trace").error("Task workers.training.training_run_execute[2] raised")
logging.getLogger("strop.training").info("training run 7 started")
"""


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_manage_py_command_prints_no_axes_banner():
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "AXES" not in done.stdout + done.stderr


def test_make_ups_console_leaves_routine_task_lines_out_and_the_log_file_keeps_them(tmp_path):
    log_file = tmp_path / "strop.jsonl"
    done = run_python(LOG_SOME_LINES, LOG_QUIET="1", LOG_FORMAT="plain", LOG_FILE=str(log_file))
    assert done.returncode == 0, done.stderr
    console = done.stderr
    assert "Sending due task" not in console and "received" not in console and "succeeded" not in console
    assert "ERROR celery.app.trace: Task workers.training.training_run_execute[2] raised" in console
    assert "INFO strop.training: training run 7 started" in console
    kept = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [entry["logger"] for entry in kept] == [
        "celery.beat",
        "celery.worker.strategy",
        "celery.app.trace",
        "celery.app.trace",
        "strop.training",
    ]


def test_without_log_quiet_the_console_keeps_every_line_as_json():
    done = run_python(LOG_SOME_LINES, LOG_QUIET="", LOG_FORMAT="json", LOG_FILE="")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [entry["message"].split(" ", 1)[0] for entry in lines] == ["Scheduler:", "Task", "Task", "Task", "training"]
