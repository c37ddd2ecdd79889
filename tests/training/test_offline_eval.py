"""A run evaluates its candidate on the tenant's eval set, and the version carries the figures:
the API's version read shows them, and only to the tenant that owns the version (issue 46)."""

from __future__ import annotations

import pytest

from apps.training.models import TrainingPolicy
from apps.training.services import training_schedule
from tests.training.test_serve_probe_privacy import ingest_distinct_tokens

pytestmark = pytest.mark.django_db(transaction=True)  # the run's heartbeat reads it from a connection of its own

CASES = [
    {"prefix": "def add(a, b):\n    ", "suffix": "\n", "middle": "return a + b\n"},
    {"prefix": "def sub(a, b):\n    ", "suffix": "\n", "middle": "return a - b"},
    {"prefix": "for i in range(3):\n    ", "suffix": "\n", "middle": "print(i)"},
    {"prefix": "def neg(a):\n    ", "suffix": "\n", "middle": "return -a"},
    {"prefix": "while items:\n    ", "suffix": "\n", "middle": "items.pop()"},
]


def test_a_candidate_is_evaluated_on_the_eval_set_and_the_api_reads_it_to_its_tenant_only(
    tiny_adapter, client_a, make_tenant, make_client, settings, tmp_path, execute_run
):
    settings.STROP_RUN_ROOT = tmp_path
    assert client_a.put("/v1/adapters/tab/eval-set", {"cases": CASES}, format="json").status_code == 200
    ingest_distinct_tokens(tiny_adapter.tenant, set())
    # The tiny model's middles are noise either way: the widest FIM tolerance lets the candidate through.
    TrainingPolicy.objects.filter(adapter=tiny_adapter).update(
        heldout_fraction=0.0, gate_overrides={"fim_margin": 1.0, "max_new_tokens": 8}
    )
    run = training_schedule(tiny_adapter, force=True)
    outcome = execute_run(run)
    run.refresh_from_db()
    assert outcome == "candidate" and run.gate["fim_count"] == len(CASES), (outcome, run.error, run.gate)

    response = client_a.get(f"/v1/adapters/tab/versions/{run.output_version.number}")
    assert response.status_code == 200
    offline = response.json()["offline_eval"]
    assert offline == client_a.get("/v1/adapters/tab/versions").json()[0]["offline_eval"]
    assert make_client(make_tenant("tenant-b")).get("/v1/adapters/tab/versions/1").status_code == 404
    assert offline["cases"] == len(CASES) and offline["eval_set"]["cases"] == len(CASES)
    assert offline["check"] == "passed" and offline["rule"] == "paired"  # five cases: enough for an interval
    assert run.gate["fim_interval"]["bound"] == -1.0
    assert offline["base"] is None  # the parent is the base model: no separate row
    for model in ("parent", "candidate"):
        figures = offline[model]
        assert set(figures) == {"first_line_match", "exact_match", "edit_similarity"}
        assert all(f["n"] == len(CASES) and f["low"] <= f["value"] <= f["high"] for f in figures.values())
    assert offline["lift"]["edit_similarity"]["value"] == pytest.approx(
        offline["candidate"]["edit_similarity"]["value"] - offline["parent"]["edit_similarity"]["value"]
    )
