from __future__ import annotations

import pytest

from apps.training.models import EvalSet, TrainingRun

pytestmark = pytest.mark.django_db


def test_admin_reads_and_changes_the_training_policy(client_a, tiny_adapter):
    assert client_a.get("/v1/adapters/tab/training-policy").json()["min_new_events"] == 8
    changed = client_a.patch(
        "/v1/adapters/tab/training-policy", {"min_new_events": 64, "reward_rejected": -1}, format="json"
    )
    assert changed.status_code == 200
    assert (changed.json()["min_new_events"], changed.json()["reward_rejected"]) == (64, -1.0)
    gate = {"show_gate": False, "show_gate_recall": 0.9, "show_gate_explore": 0}
    assert client_a.patch("/v1/adapters/tab/training-policy", gate, format="json").json() | gate == \
        client_a.get("/v1/adapters/tab/training-policy").json()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"min_new_events": 0}, "min_new_events"),
        ({"colour": "red"}, "colour"),
        ({"enabled": "yes"}, "enabled"),
        ({"heldout_fraction": 0.95}, "heldout_fraction"),
        ({"trainer_overrides": {"learning_rat": 1e-4}}, "trainer_overrides"),
        ({"trainer_overrides": {"clip_eps": -1.0}}, "trainer_overrides"),
        ({"show_gate_recall": 0.2}, "show_gate_recall"),
        ({"show_gate_explore": 1.5}, "show_gate_explore"),
        ({"show_gate": 1}, "show_gate"),
    ],
)
def test_bad_policy_changes_are_400_naming_the_field(client_a, tiny_adapter, body, words):
    response = client_a.patch("/v1/adapters/tab/training-policy", body, format="json")
    assert response.status_code == 400 and response.json()["error"]["message"].startswith(words)


def test_eval_set_upload_is_validated_and_stored(client_a, tiny_adapter):
    good = {"cases": [{"prefix": "def f():\n    ", "suffix": "\n", "middle": "return 1"}]}
    assert client_a.put("/v1/adapters/tab/eval-set", good, format="json").status_code == 200
    assert EvalSet.objects.get(adapter=tiny_adapter).cases == good["cases"]
    bad = client_a.put("/v1/adapters/tab/eval-set", {"cases": [{"prefix": "x"}]}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("cases[0]")


def test_admin_starts_a_run_and_a_second_is_409(client_a, tiny_adapter):
    started = client_a.post("/v1/adapters/tab/training-runs")
    assert started.status_code == 202 and started.json()["status"] == "queued"
    assert client_a.post("/v1/adapters/tab/training-runs").status_code == 409
    run_id = started.json()["id"]
    assert client_a.get(f"/v1/training-runs/{run_id}").json()["trigger"] == "forced"
    assert [r["id"] for r in client_a.get("/v1/adapters/tab/training-runs").json()] == [run_id]
    assert TrainingRun.objects.count() == 1
