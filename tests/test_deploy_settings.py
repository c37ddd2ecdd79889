"""Safe by default when deployed: the settings refuse to start without real secrets (every one in
config/secret_keys.py's table) or with mail that would print reset links to the log, env.example
passes Django's deployment checks, and the embedded default still starts with nothing set.

Each case starts the settings in a process of its own with an environment made for it (settings are
read once per process)."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV_EXAMPLE = ROOT / "platform" / "env.example"
PRINT_SECRETS = (
    "import django; django.setup(); from django.conf import settings; "
    "print(settings.SECRET_KEY); print(settings.API_KEY_PEPPER)"
)


def env_example() -> dict[str, str]:
    """platform/env.example's settings, as a shell would read them."""
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def bare_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """Nothing of this process's environment but what finds Python, plus ``settings``; the embedded
    default's files (var/) and the metrics folder in ``tmp_path``."""
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        STROP_VAR_DIR=str(tmp_path / "var"),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
    )
    env.update(settings)
    return env


def deployment_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """env.example filled in as an operator would (real secrets), on the test run's Postgres and Redis."""
    env = bare_env(tmp_path, **env_example())
    env.update(
        SECRET_KEY=secrets.token_urlsafe(50),
        API_KEY_PEPPER=secrets.token_urlsafe(50),
        ERASURE_MARK_KEY=secrets.token_urlsafe(50),
        STORED_SECRETS_KEY=secrets.token_urlsafe(50),
        VLLM_API_KEY=secrets.token_urlsafe(32),
        STROP_METRICS_TOKEN=secrets.token_urlsafe(32),
        EMAIL_HOST_PASSWORD=secrets.token_urlsafe(16),
        DATABASE_URL=os.environ["DATABASE_URL"],
        REDIS_URL=os.environ["REDIS_URL"],
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
    )
    env.update(overrides)
    return {name: value for name, value in env.items() if value is not None}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_check_deploy_passes_with_env_example_filled_in(tmp_path):
    done = run(deployment_env(tmp_path), "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_env_example_as_shipped_is_refused_naming_every_placeholder(tmp_path):
    env = bare_env(tmp_path, **env_example())
    env.update(DATABASE_URL=os.environ["DATABASE_URL"], REDIS_URL=os.environ["REDIS_URL"])

    done = run(env, "manage.py", "check")

    assert done.returncode != 0
    for name in ("SECRET_KEY", "API_KEY_PEPPER", "VLLM_API_KEY", "STROP_METRICS_TOKEN", "EMAIL_HOST_PASSWORD"):
        assert f"{name} is not a real secret: it is a placeholder" in done.stderr, name


@pytest.mark.parametrize(
    ("unset", "set_too"),
    [
        ("SECRET_KEY", "API_KEY_PEPPER"),
        ("API_KEY_PEPPER", "SECRET_KEY"),
        ("ERASURE_MARK_KEY", "SECRET_KEY"),
        ("STORED_SECRETS_KEY", "SECRET_KEY"),
    ],
)
def test_a_deployment_missing_one_secret_does_not_start_and_names_it(tmp_path, unset, set_too):
    env = deployment_env(tmp_path)
    del env[unset]

    done = run(env, "-c", PRINT_SECRETS)

    assert done.returncode != 0
    assert f"ImproperlyConfigured: {unset} is not set" in done.stderr
    assert f"{set_too} is not" not in done.stderr
    assert not (tmp_path / "var" / unset.lower()).exists()  # nothing generated in its place


def test_the_pepper_no_longer_falls_back_to_the_secret_key(tmp_path):
    env = deployment_env(tmp_path)
    del env["API_KEY_PEPPER"]

    done = run(env, "-c", PRINT_SECRETS)

    assert done.returncode != 0
    assert "API_KEY_PEPPER is not set (it no longer falls back to SECRET_KEY" in done.stderr


def test_the_erasure_mark_key_is_required_when_deployed_and_says_how_to_keep_old_marks(tmp_path):
    env = deployment_env(tmp_path)
    del env["ERASURE_MARK_KEY"]

    done = run(env, "-c", PRINT_SECRETS)

    assert done.returncode != 0
    assert "ERASURE_MARK_KEY is not set (erasure marks no longer use SECRET_KEY" in done.stderr


def test_the_embedded_default_generates_an_erasure_mark_key_of_its_own(tmp_path):
    code = "import django; django.setup(); from django.conf import settings; print(settings.ERASURE_MARK_KEY)"
    done = run(bare_env(tmp_path), "-c", code)

    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    path = tmp_path / "var" / "erasure_mark_key"
    assert len(key) >= 50 and path.read_text().strip() == key and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key != (tmp_path / "var" / "secret_key").read_text().strip()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("change-me", "it is a placeholder (contains 'change-me')"),
        ("django-insecure-" + secrets.token_urlsafe(50), "it is a placeholder (contains 'insecure')"),
        ("s3cr3t-but-sh0rt", "it has 16 characters, fewer than 50"),
        ("ab" * 40, "it has fewer than 10 distinct characters"),
    ],
)
def test_a_deployment_with_a_weak_secret_does_not_start(tmp_path, value, reason):
    done = run(deployment_env(tmp_path, SECRET_KEY=value), "-c", PRINT_SECRETS)

    assert done.returncode != 0
    assert f"SECRET_KEY is not a real secret: {reason}" in done.stderr
    assert "API_KEY_PEPPER is not" not in done.stderr


def test_a_weak_secret_is_refused_on_the_embedded_default_too(tmp_path):
    done = run(bare_env(tmp_path, API_KEY_PEPPER="change-me-too"), "-c", PRINT_SECRETS)

    assert done.returncode != 0
    assert "API_KEY_PEPPER is not a real secret: it is a placeholder" in done.stderr


def test_the_embedded_default_starts_with_nothing_set_and_keeps_its_generated_secrets(tmp_path):
    env = bare_env(tmp_path)

    # Processes that start together (API, workers) race to write the secrets: all must agree.
    with ThreadPoolExecutor(3) as pool:
        started = list(pool.map(lambda _: run(env, "-c", PRINT_SECRETS), range(3)))
    again = run(env, "-c", PRINT_SECRETS)

    for done in [*started, again]:
        assert done.returncode == 0, done.stderr
    outputs = {done.stdout for done in [*started, again]}
    assert len(outputs) == 1
    secret_key, pepper = outputs.pop().split()
    assert secret_key != pepper and len(secret_key) >= 50 and len(pepper) >= 50
    for name, value in (("secret_key", secret_key), ("api_key_pepper", pepper)):
        path = tmp_path / "var" / name
        assert path.read_text().strip() == value
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in (tmp_path / "var").glob(".*")) == []  # no scratch files left behind


def test_the_embedded_default_passes_its_own_checks(tmp_path):
    done = run(bare_env(tmp_path), "manage.py", "check", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_pages_carry_the_content_security_policy_and_httponly_cookies(client, db):
    response = client.get("/dashboard/login/")

    policy = dict(part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["object-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    assert response.cookies["csrftoken"]["httponly"]
    assert "Content-Security-Policy" not in client.get("/health")  # JSON for API clients: no policy to build


@pytest.mark.parametrize(("value", "starts"), [("-1", False), ("0", True), ("30", True)])
def test_a_negative_retention_maximum_does_not_start(tmp_path, value, starts):
    """A negative maximum would put every tenant's retention cutoff in the future: the settings
    refuse it, where a retention pass would have deleted nearly everything."""
    done = run(
        deployment_env(tmp_path, STROP_RETENTION_MAX_DAYS=value),
        "-c",
        "import django; django.setup(); from django.conf import settings; print(settings.STROP_RETENTION_MAX_DAYS)",
    )
    if starts:
        assert done.returncode == 0 and done.stdout.strip() == value, done.stderr
    else:
        assert done.returncode != 0
        assert "STROP_RETENTION_MAX_DAYS=-1: give a number of days, or 0 for no maximum" in done.stderr
