"""A version keeps nothing derived from an end user's text: its serve probe is the synthetic
sequence, in the base model's ids, whatever it was trained on (issue 40, "erase means gone")."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.models import TrainingPolicy
from apps.training.services import training_schedule
from gpu_trainer.probe import probe_tokens

pytestmark = pytest.mark.django_db(transaction=True)  # the run's heartbeat reads it from a connection of its own


def ingest_distinct_tokens(tenant, probe_ids: set[int], n: int = 16) -> set[int]:
    """n labelled interactions whose token ids share none with the synthetic probe; their ids."""
    free = [i for i in range(1400, 1700) if i not in probe_ids]
    used: set[int] = set()
    items = []
    for k in range(n):
        prompt = [free[(k * 7 + j) % 150] for j in range(12)]
        completion = [free[150 + (k * 3 + j) % 100] for j in range(4)]
        used.update(prompt, completion)
        items.append(
            {
                "client_id": f"private-code-{k}",
                "prompt": f"secret_{k} = ",
                "completion": "42",
                "prompt_token_ids": prompt,
                "completion_token_ids": completion,
                "completion_logprobs": [-0.5] * len(completion),
                "end_user_id": f"dev-{k % 4}",
                "opted_in": True,
            }
        )
    results = interactions_ingest(tenant, items=items)
    outcomes = ["accepted", "rejected"]
    feedback_ingest(
        tenant, items=[{"client_id": r.client_id, "outcome": outcomes[k % 2]} for k, r in enumerate(results)]
    )
    return used


def test_a_trained_versions_serve_probe_holds_no_token_of_its_training_data(tiny_adapter, client_a, execute_run):
    synthetic = probe_tokens(AutoTokenizer.from_pretrained(tiny_adapter.base_model.path))
    probe_ids = {*synthetic["prompt_token_ids"], *synthetic["completion_token_ids"]}
    trained_ids = ingest_distinct_tokens(tiny_adapter.tenant, probe_ids)
    TrainingPolicy.objects.filter(adapter=tiny_adapter).update(heldout_fraction=0.0)
    run = training_schedule(tiny_adapter, force=True)
    outcome = execute_run(run)
    run.refresh_from_db()
    assert outcome == "candidate" and run.output_version is not None, (outcome, run.error, run.gate)

    probe = run.output_version.metrics["serve_probe"]
    stored = {*probe["prompt_token_ids"], *probe["completion_token_ids"]}
    assert not stored & trained_ids, "the probe holds token ids of the training data"
    assert {k: probe[k] for k in synthetic} == synthetic and probe["source"] == "synthetic"

    listed = client_a.get("/v1/adapters/tab/versions")
    assert listed.status_code == 200
    [version] = listed.json()
    numbers = _ints(version)
    assert not numbers & trained_ids, "GET /v1/adapters/{name}/versions returns token ids of the training data"


def _ints(value: object) -> set[int]:
    """Every integer anywhere in a JSON value."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_ints(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_ints(v) for v in value)) if value else set()
    return set()
