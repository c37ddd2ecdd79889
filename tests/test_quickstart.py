"""The README's "Integrate in five minutes" runs as written: its ``sh`` and ``python`` blocks, in
order, against a live server on the test database and the session's real vLLM, the way a newcomer
pastes them into a terminal. What the blocks wrote is then read back from the database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from apps.cohorts.models import EndUser
from apps.interactions.models import Feedback, Interaction
from apps.tenants.models import Tenant

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Integrate in five minutes"


def quickstart_blocks() -> list[tuple[str, str]]:
    """(language, code) of every ``sh`` and ``python`` block of the section, in order."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(sh|python)\n(.*?)```", section, flags=re.DOTALL)


def _database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def test_the_quickstart_has_shell_and_sdk_blocks():
    languages = [language for language, _ in quickstart_blocks()]
    assert languages.count("sh") >= 3 and languages.count("python") >= 2


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
            done = subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
        else:
            done = subprocess.run(
                [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
            )
        assert done.returncode == 0, f"block {index} ({language}) failed:\n{code}\n{done.stdout}\n{done.stderr}"
        if language == "sh":
            env = dict(item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item)

    tenant = Tenant.objects.get(slug="acme")
    served = Interaction.objects.filter(tenant=tenant, source=Interaction.Source.SERVED)
    assert served.count() == 2
    outcomes = dict(
        Feedback.objects.filter(interaction__in=served).values_list("interaction__end_user_id", "outcome")
    )
    assert outcomes == {"dev-42": "accepted", "dev-43": "rejected"}
    logged = Interaction.objects.filter(tenant=tenant, source=Interaction.Source.LOGGED)
    assert set(logged.values_list("client_id", flat=True)) == {"cmp-0001", "cmp-0002"}
    assert Feedback.objects.get(tenant=tenant, interaction__client_id="cmp-0001").outcome == "accepted"
    kept = Feedback.objects.get(tenant=tenant, interaction__client_id="cmp-0002")
    assert (kept.outcome, kept.kept_text) == ("edited", "return a - b")
    assert EndUser.objects.get(tenant=tenant, external_id="dev-42").opted_in
    assert not EndUser.objects.get(tenant=tenant, external_id="dev-45").opted_in
