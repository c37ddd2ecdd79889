"""What the benchmarks share: a fresh Postgres database, gunicorn, vLLM, percentiles."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/strop"
# With DATABASE_URL set the settings need real secrets (config/secret_keys.py); a benchmark's database is
# made fresh, so random ones per run, shared by every process it starts (they must hash API keys alike),
# will do. Strop sends the vLLM key to vLLMs of the benchmarks' own, which have none and ignore it. A
# deployment sends reset mail by SMTP: the benchmarks send none.
RUN_SECRETS = {
    **{
        name: secrets.token_urlsafe(50)
        for name in ("SECRET_KEY", "API_KEY_PEPPER", "ERASURE_MARK_KEY", "STORED_SECRETS_KEY")
    },
    "VLLM_API_KEY": secrets.token_urlsafe(32),
    "EMAIL_HOST": "127.0.0.1",
}


def django_env(db_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, DATABASE_URL=db_url, DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(ROOT))
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
    for name, value in RUN_SECRETS.items():
        if not env.get(name):
            env[name] = value
    env.update(extra)
    return env


def fresh_database(base_url: str, dbname: str) -> str:
    """Drop and create ``dbname`` next to ``base_url``'s database, migrate it, return its URL."""
    parsed = urlparse(base_url)
    admin = psycopg.connect(
        host=parsed.hostname,
        port=parsed.port or 5432,
        user=parsed.username or "postgres",
        dbname="postgres",
        autocommit=True,
    )
    with admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}"')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    db_url = parsed._replace(path=f"/{dbname}").geturl()
    manage("migrate", "-v", "0", db_url=db_url)
    return db_url


def manage(*args: str, db_url: str, **extra_env: str) -> str:
    done = subprocess.run(
        [PY, "manage.py", *args],
        cwd=ROOT,
        env=django_env(db_url, **extra_env),
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def setup_django(db_url: str, **extra_env: str) -> None:
    os.environ.update(django_env(db_url, **extra_env))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited during start-up")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not answer {url} within {timeout_s:.0f} s")


def gunicorn_argv(bind: str, workers: int) -> list[str]:
    """The API under gunicorn as the Procfile runs it (uvicorn workers on config.asgi), bound to ``bind``."""
    return [PY, "-m", "gunicorn", "-c", "platform/gunicorn.conf.py", "config.asgi", "-b", bind,
            "-w", str(workers), "-k", "config.uvicorn_worker.StropUvicornWorker", "--log-level", "warning"]  # fmt: skip


def start_gunicorn(
    db_url: str,
    port: int,
    workers: int,
    *,
    log: IO[bytes] | int | None = None,
    timeout_s: float = 60,
    root: Path = ROOT,
    **extra_env: str,
) -> subprocess.Popen:
    """Gunicorn on ``port`` in a process group of its own, answering /health; stopped again if it
    does not come up. ``log`` takes its output (default: this process's). ``root``: the checkout
    it runs (default this one; another one uses this one's Python environment)."""
    proc = subprocess.Popen(
        gunicorn_argv(f"127.0.0.1:{port}", workers),
        cwd=root,
        env=django_env(db_url, **({"PYTHONPATH": str(root)} | extra_env)),
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout_s, "gunicorn")
    except BaseException:
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen, *, grace_s: float = 30.0) -> None:
    """SIGTERM the process group; SIGKILL it if it has not exited ``grace_s`` seconds later."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
