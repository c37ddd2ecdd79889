"""Every secret Strop or its replicas read is checked one way when deployed (config/secret_keys.py's
table): a missing, short, placeholder, published or test-suite value refuses start-up and the error
names the setting; password-reset mail that would be printed, kept or dropped refuses it too; and
platform/vllm.sh refuses a weak key before vLLM loads anything.

Each settings case starts the settings in a process of its own (tests/test_deploy_settings.py's
helpers), as an operator's process would."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest

from config.secret_keys import PLACEHOLDER_MARKERS, SECRETS, published_values, secret_problems, weakness
from tests.test_deploy_settings import PRINT_SECRETS, ROOT, bare_env, deployment_env, run

# The fixed secrets tests/secrets_env.py held until the suite made its own per session: public (in the
# repository's history, and copied into the app image), so a deployment that copied them must not start.
FORMER_SUITE_SECRETS = {
    "SECRET_KEY": "strop-test-suite-secret-key-YGxM7NoUzhhcMJFW-gl3nU2RtWhIBGHlK0GcrmaLHr_8ccjSromXwA",
    "API_KEY_PEPPER": "strop-test-suite-api-key-pepper-7jYMkXx7-KLDJlCfyOYqowG5n5eTsoot1bfiYPEarszZG-D480_ZA",
}
POSTGRES = "postgres://strop:{}@127.0.0.1:5432/strop"
STORE = {"STROP_ADAPTER_STORE": "s3://strop-adapters/a", "AWS_ACCESS_KEY_ID": "strop"}


def refused(env: dict[str, str]) -> str:
    done = run(env, "-c", PRINT_SECRETS)
    assert done.returncode != 0, f"started with {env}"
    assert "ImproperlyConfigured" in done.stderr, done.stderr
    return done.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"VLLM_API_KEY": None}, "VLLM_API_KEY is not set"),
        ({"VLLM_API_KEY": "change-me-vllm"}, "VLLM_API_KEY is not a real secret: it is a placeholder"),
        ({"VLLM_API_KEY": secrets.token_urlsafe(16)}, "VLLM_API_KEY is not a real secret: it has 22 characters"),
        ({"STROP_METRICS_TOKEN": "change-me-metrics"}, "STROP_METRICS_TOKEN is not a real secret: it is a placeholder"),
        ({"STROP_METRICS_TOKEN": "0123456789" * 2}, "STROP_METRICS_TOKEN is not a real secret: it has 20 characters"),
        ({**STORE, "AWS_SECRET_ACCESS_KEY": None}, "AWS_SECRET_ACCESS_KEY is not set"),
        (
            {**STORE, "AWS_SECRET_ACCESS_KEY": "change-me-object-store"},
            "AWS_SECRET_ACCESS_KEY is not a real secret: it is a placeholder",
        ),
        ({"STROP_STORE_PURGE_KEY_ID": "strop-store-purger"}, "STROP_STORE_PURGE_SECRET is not set"),
        (
            {"STROP_STORE_PURGE_KEY_ID": "strop-store-purger", "STROP_STORE_PURGE_SECRET": "change-me-store-purger"},
            "STROP_STORE_PURGE_SECRET is not a real secret: it is a placeholder",
        ),
        ({"DATABASE_URL": POSTGRES.format("change-me-postgres")}, "the password in DATABASE_URL is not a real secret"),
        ({"DATABASE_URL": POSTGRES.format("hunter2")}, "the password in DATABASE_URL is not a real secret: it has 7"),
        ({"REDIS_URL": "redis://:s3cret@127.0.0.1:6379/5"}, "the password in REDIS_URL is not a real secret: it has 6"),
        ({"EMAIL_HOST_PASSWORD": None}, "EMAIL_HOST_PASSWORD is not set"),
        ({"EMAIL_HOST_PASSWORD": "change-me-smtp"}, "EMAIL_HOST_PASSWORD is not a real secret: it is a placeholder"),
        ({"SECRET_KEY": FORMER_SUITE_SECRETS["SECRET_KEY"]}, "SECRET_KEY is not a real secret: it is a placeholder"),
        (
            {"API_KEY_PEPPER": FORMER_SUITE_SECRETS["API_KEY_PEPPER"]},
            "API_KEY_PEPPER is not a real secret: it is a placeholder (contains 'strop-test')",
        ),
    ],
    ids=[
        "vllm-missing",
        "vllm-placeholder",
        "vllm-short",
        "metrics-placeholder",
        "metrics-short",
        "store-missing",
        "store-placeholder",
        "purge-missing",
        "purge-placeholder",
        "database-placeholder",
        "database-short",
        "redis-short",
        "email-missing",
        "email-placeholder",
        "suite-secret-key",
        "suite-pepper",
    ],
)
def test_a_deployment_with_a_weak_or_missing_secret_does_not_start_and_names_it(tmp_path, overrides, message):
    stderr = refused(deployment_env(tmp_path, **overrides))

    assert message in stderr
    assert stderr.count(" is not ") == 1, stderr  # only the one at fault is named


def test_each_secret_is_named_once_with_every_problem_in_one_error(tmp_path):
    env = deployment_env(tmp_path, VLLM_API_KEY="short", STROP_METRICS_TOKEN="change-me", EMAIL_HOST=None)

    stderr = refused(env)

    assert "VLLM_API_KEY is not a real secret" in stderr and "STROP_METRICS_TOKEN is not a real secret" in stderr
    assert "EMAIL_BACKEND is console" in stderr


def test_the_password_redis_url_and_the_broker_share_is_named_once(tmp_path):
    stderr = refused(deployment_env(tmp_path, REDIS_URL="redis://:s3cret@127.0.0.1:6379/5"))

    assert stderr.count("s3cret") == 0 and stderr.count("the password in") == 1  # never the value itself


def test_the_suite_makes_its_secrets_per_session_and_writes_none_down():
    values = {name: os.environ[name] for name in ("SECRET_KEY", "API_KEY_PEPPER", "VLLM_API_KEY")}
    for name, value in values.items():
        assert weakness(value, next(s.min_length for s in SECRETS if s.setting == name)) is None, name
        assert value not in FORMER_SUITE_SECRETS.values()
    written = subprocess.run(
        ["git", "grep", "-l", "-F", *(f"-e{value}" for value in values.values())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert written.stdout == "", f"a session's secret is written in {written.stdout}"


@pytest.mark.parametrize("backend", ["console", "locmem", "dummy", "filebased"])
def test_a_deployment_that_would_not_send_reset_mail_does_not_start(tmp_path, backend):
    env = deployment_env(tmp_path, EMAIL_BACKEND=f"django.core.mail.backends.{backend}.EmailBackend")

    stderr = refused(env)

    assert f"EMAIL_BACKEND is {backend}" in stderr and "set EMAIL_HOST" in stderr


def test_without_email_host_a_deployment_falls_back_to_console_and_is_refused(tmp_path):
    env = deployment_env(tmp_path, EMAIL_HOST=None, EMAIL_HOST_USER=None, EMAIL_HOST_PASSWORD=None)

    assert "EMAIL_BACKEND is console, which prints every message, reset links included, to the log" in refused(env)


def test_a_deployment_with_smtp_reads_its_settings_from_the_environment(tmp_path):
    password = secrets.token_urlsafe(16)
    env = deployment_env(
        tmp_path, EMAIL_HOST="mail.internal", EMAIL_PORT="465", EMAIL_USE_TLS="false", EMAIL_USE_SSL="true",
        EMAIL_HOST_USER="strop", EMAIL_HOST_PASSWORD=password,
    )  # fmt: skip
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.EMAIL_BACKEND, s.EMAIL_HOST, s.EMAIL_PORT, s.EMAIL_USE_SSL, s.EMAIL_USE_TLS, s.EMAIL_HOST_USER, "
        "s.EMAIL_HOST_PASSWORD == " + repr(password) + ")"
    )

    done = run(env, "-c", code)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "django.core.mail.backends.smtp.EmailBackend", "mail.internal", "465", "True", "False", "strop", "True"
    ]  # fmt: skip


def test_the_embedded_default_and_debug_keep_console_mail(tmp_path):
    assert run(bare_env(tmp_path), "-c", PRINT_SECRETS).returncode == 0
    debug = deployment_env(tmp_path, DEBUG="true", VLLM_API_KEY=None, EMAIL_HOST=None, SECRET_KEY=None)
    assert run(debug, "-c", PRINT_SECRETS).returncode == 0


def test_the_table_checks_a_secret_only_once_the_settings_hold_it():
    """A line of the table is checked only for settings that hold its name."""
    assert secret_problems({}, deployed=True, published=frozenset()) == []
    assert secret_problems({"ERASURE_MARK_KEY": ""}, deployed=True, published=frozenset()) == [
        "ERASURE_MARK_KEY is not set (erasure marks no longer use SECRET_KEY: to keep the marks made so far, set "
        "it to the SECRET_KEY they were made under)"
    ]
    assert secret_problems({"ERASURE_MARK_KEY": "change-me"}, deployed=False, published=frozenset()) == [
        "ERASURE_MARK_KEY is not a real secret: it is a placeholder (contains 'change-me')"
    ]
    assert secret_problems({"STORED_SECRETS_KEY": ""}, deployed=True, published=frozenset()) == [
        "STORED_SECRETS_KEY is not set (it encrypts the webhook signing secrets Strop stores; the upgrade that "
        "added it seals the existing ones with it, so set it before migrating)"
    ]


def test_a_value_published_in_the_example_settings_is_refused_even_without_a_marker(tmp_path):
    example = tmp_path / "platform" / "env.example"
    example.parent.mkdir()
    example.write_text(
        "SOMETHING=Xq7vR2mK9pL4wN8zT1yB6cF3hJ5dG0sA\n# REDIS_URL=redis://:Pw9xK2mQ7vL4nR8tY1bC@h:6379/0\n"
    )
    published = published_values(tmp_path)

    assert weakness("Xq7vR2mK9pL4wN8zT1yB6cF3hJ5dG0sA", 24, published) is not None
    assert weakness("Pw9xK2mQ7vL4nR8tY1bC", 16, published) is not None
    assert weakness(secrets.token_urlsafe(24), 24, published) is None


# platform/vllm.sh: the key checked before anything loads. A stand-in for vLLM's python records that
# it was started (the real server starts in tests/fixtures/vllm.py, with the session's key).


@pytest.fixture
def fake_vllm(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho started\n")
    python.chmod(0o755)
    return {"PATH": os.environ["PATH"], "VLLM_VENV": str(tmp_path / "venv"), "MODEL": str(tmp_path / "model")}


def vllm_sh(fake_vllm: dict[str, str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "platform" / "vllm.sh"), fake_vllm["MODEL"]],
        env={"PATH": fake_vllm["PATH"], "VLLM_VENV": fake_vllm["VLLM_VENV"], **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "key",
    [
        *(marker + secrets.token_urlsafe(32) for marker in PLACEHOLDER_MARKERS),
        secrets.token_urlsafe(16),
        "ab" * 20,
    ],
)
@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_vllm_sh_refuses_a_weak_key_wherever_it_listens(fake_vllm, key, host):
    done = vllm_sh(fake_vllm, VLLM_API_KEY=key, VLLM_BIND_HOST=host)

    assert done.returncode == 2 and "started" not in done.stdout
    assert "VLLM_API_KEY is not a real secret" in done.stderr
    assert key not in done.stderr


def test_vllm_sh_refuses_to_listen_beyond_loopback_without_a_key(fake_vllm):
    done = vllm_sh(fake_vllm, VLLM_BIND_HOST="0.0.0.0")

    assert done.returncode == 2 and "started" not in done.stdout
    assert "VLLM_API_KEY is not set" in done.stderr


def test_vllm_sh_starts_anywhere_with_a_real_key(fake_vllm):
    done = vllm_sh(fake_vllm, VLLM_BIND_HOST="0.0.0.0", VLLM_API_KEY=secrets.token_urlsafe(32))

    assert done.returncode == 0 and done.stdout.strip() == "started", done.stderr
    assert "VLLM_API_KEY" not in done.stderr


def test_vllm_sh_starts_on_loopback_without_a_key_and_warns(fake_vllm):
    """`make up` and the benchmarks: a vLLM only this machine's processes reach."""
    done = vllm_sh(fake_vllm, VLLM_BIND_HOST="127.0.0.1")

    assert done.returncode == 0 and done.stdout.strip() == "started", done.stderr
    assert "VLLM_API_KEY is not set" in done.stderr


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        (None, "AWS_SECRET_ACCESS_KEY is not set"),
        ("change-me-object-store", "AWS_SECRET_ACCESS_KEY is not a real secret: it is a placeholder"),
        ("Xq7vR2mK9pL4", "AWS_SECRET_ACCESS_KEY is not a real secret: it has 12 characters, fewer than 24"),
    ],
    ids=["missing", "placeholder", "short"],
)
def test_vllm_sh_refuses_a_weak_store_secret_that_comes_with_a_key_id(fake_vllm, secret, message):
    store = {"STROP_ADAPTER_STORE": "s3://strop-adapters/a", "AWS_ACCESS_KEY_ID": "replica"}
    if secret is not None:
        store["AWS_SECRET_ACCESS_KEY"] = secret

    done = vllm_sh(fake_vllm, VLLM_API_KEY=secrets.token_urlsafe(32), **store)

    assert done.returncode == 2 and "started" not in done.stdout
    assert message in done.stderr


def test_vllm_sh_starts_with_a_real_store_secret(fake_vllm):
    store = {"STROP_ADAPTER_STORE": "s3://strop-adapters/a", "AWS_ACCESS_KEY_ID": "replica"}

    done = vllm_sh(
        fake_vllm, VLLM_API_KEY=secrets.token_urlsafe(32), AWS_SECRET_ACCESS_KEY=secrets.token_urlsafe(30), **store
    )

    assert done.returncode == 0 and done.stdout.strip() == "started", done.stderr
