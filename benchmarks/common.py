"""What the benchmarks share: a fresh Postgres database, gunicorn, vLLM, percentiles."""

from __future__ import annotations

import difflib
import os
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


def django_env(db_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, DATABASE_URL=db_url, DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(ROOT))
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
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


def start_gunicorn(
    db_url: str, port: int, workers: int, *, log: IO[bytes] | None = None, timeout_s: float = 60, **extra_env: str
) -> subprocess.Popen:
    """Gunicorn on ``port`` in a process group of its own, answering /health; stopped again if it
    does not come up. ``log`` takes its output (default: this process's)."""
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "gunicorn",
            "config.wsgi",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            str(workers),
            "-k",
            "gthread",
            "--threads",
            "4",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=django_env(db_url, **extra_env),
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


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- a simulated developer: what the benchmarks and the demo type and accept ----


def fim_cases(count: int, *, start: int = 0) -> list[dict[str, str]]:
    """(prefix, suffix, middle) cut from the standard library: the line a developer typed next.
    ``start`` skips that many cases, for a second set that does not repeat the first."""
    import sysconfig

    cases = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        lines = path.read_text(errors="replace").splitlines()
        for cut in range(8, len(lines) - 4, 53):
            middle = lines[cut]
            if len(middle.strip()) < 8:
                continue
            cases.append(
                {
                    "prefix": "\n".join(lines[cut - 6 : cut]) + "\n",
                    "suffix": "\n" + "\n".join(lines[cut + 1 : cut + 3]),
                    "middle": middle,
                }
            )
            if len(cases) == start + count:
                return cases[start:]
    return cases[start:]


def developer_accepts(completion: str, middle: str) -> bool:
    first = completion.split("\n", 1)[0]
    # A lenient developer: the starter model is small, and this keeps about a third accepted.
    return bool(first.strip()) and difflib.SequenceMatcher(None, first.strip(), middle.strip()).ratio() >= 0.2


def serve_as_developers(
    http: httpx.Client,
    cases: list[dict[str, str]],
    *,
    workers: int,
    max_tokens: int = 16,
    users: int = 8,
    progress: str | None = None,
) -> list[tuple[str, bool]]:
    """Opted-in developers ask Strop for a FIM completion on each case; returns (interaction id,
    accepted?) per case, in order. ``progress`` labels a progress bar."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: tuple[int, dict[str, str]]) -> tuple[str, bool]:
        i, case = item
        body = {
            "prefix": case["prefix"],
            "suffix": case["suffix"],
            "max_tokens": max_tokens,
            "temperature": 0.8,
            "seed": i,
            "user": f"dev-{i % users}",
            "opted_in": True,
        }
        response = http.post("/v1/completions", json=body)
        response.raise_for_status()
        data = response.json()
        return data["id"], developer_accepts(data["choices"][0]["text"], case["middle"])

    with ThreadPoolExecutor(workers) as pool:
        results = pool.map(one, enumerate(cases))
        if progress:
            from tqdm import tqdm

            results = tqdm(results, total=len(cases), desc=progress, unit="completion")
        return list(results)


def feedback_items(served: list[tuple[str, bool]]) -> list[dict[str, str]]:
    return [{"interaction_id": i, "outcome": "accepted" if ok else "rejected"} for i, ok in served]
