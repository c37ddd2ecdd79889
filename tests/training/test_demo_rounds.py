"""Two rounds of the demo's loop (demo/loop.py, what `make demo` runs) on the tiny starter
model: every round of every tenant starts a training run and waits for its own, even when the round's
feedback alone does not reach the policy's threshold (a version's show gate withholds suggestions,
and those do not train). Real API under gunicorn, Celery workers, Postgres, Redis and vLLM."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from apps.adapters.services import adapter_create, base_model_register
from apps.tenants.services import ALL_SCOPES, api_key_create
from apps.training.models import TrainingRun
from tests.fixtures.services import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]


def test_each_round_of_the_demo_trains_on_its_own_feedback(served, celery_workers, api_servers, make_tenant, tmp_path):
    from tests.fixtures.workers import _database_url

    base = base_model_register(name=served.served_model_name, path=served.model_dir)
    specs = []
    for slug, population in (("demo", "line"), ("blocks", "block")):
        tenant = make_tenant(slug)
        adapter_create(tenant, name="tab", base_model=base, is_default=True)
        key = api_key_create(tenant, name="demo", scopes=list(ALL_SCOPES)).raw_key
        specs += ["--tenant", f"{slug}:{key}:{population}"]
    shared = ("REDIS_URL", "VLLM_BASE_URLS", "VLLM_MAX_LORA_RANK", "STROP_ADAPTER_ROOT", "STROP_RUN_ROOT")
    api = api_servers.start(database_url=_database_url(), **{name: celery_workers.env[name] for name in shared})

    done = subprocess.run(
        [sys.executable, "demo/loop.py", "--base", api.url, *specs, "--events", "24", "--rounds", "2",
         "--experiment-requests", "16", "--budget-min", "60", "--context-chars", "120",
         "--report", str(tmp_path / "report"), "--trainer", json.dumps({"epochs": 1, "num_minibatches": 2})],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "no training run finished" not in out, out[-4000:]
    for slug in ("demo", "blocks"):
        runs = TrainingRun.objects.filter(tenant__slug=slug).order_by("pk")
        assert runs.count() >= 2 and all(run.status in ("candidate", "rejected") for run in runs), [
            (run.pk, run.status, run.error) for run in runs
        ]
        # The second round trained on the round's own feedback: its window is new events.
        assert runs[1].window_size + runs[1].heldout_size > 0
        reported = set(re.findall(rf"{slug}: training run (\d+): (?:candidate|rejected)", out))
        assert {str(run.pk) for run in runs[:2]} <= reported, out[-4000:]
    assert (tmp_path / "report" / "report.txt").is_file()
