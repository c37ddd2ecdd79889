"""The examples in sdk/examples run as a user would run them: a separate process, configured by
STROP_BASE_URL and STROP_API_KEY, against the live API; each must exit 0 and leave what it says
it did in the database."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from apps.experiments.models import Experiment, ExperimentExposure, ExperimentSnapshot
from apps.interactions.models import Feedback, Interaction

EXAMPLES = Path(__file__).resolve().parents[2] / "sdk" / "examples"
README = EXAMPLES.parent / "README.md"
# The scopes each example's key gets below: the least it runs with, and what its docs must say.
SCOPES = {
    "log_and_feedback.py": ["ingest", "feedback"],
    "serve_through_strop.py": ["serve", "feedback", "ingest"],
}


@pytest.mark.parametrize("name", sorted(SCOPES))
def test_the_docs_name_the_scopes_an_example_runs_with(name):
    (row,) = [line for line in README.read_text().splitlines() if line.startswith(f"| [`{name}`]")]
    assert set(re.findall(r"`(\w+)`", row.rstrip(" |").rsplit("|", 1)[1])) == set(SCOPES[name])
    docstring = ast.get_docstring(ast.parse((EXAMPLES / name).read_text())) or ""
    assert {scope for scope in ("ingest", "feedback", "serve", "admin") if f"``{scope}``" in docstring} == set(
        SCOPES[name]
    )


def run_example(name: str, *, url: str, key: str, exit_status: int = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STROP_BASE_URL": url, "STROP_API_KEY": key}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == exit_status, f"{name} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.django_db(transaction=True)
def test_log_and_feedback_logs_interactions_and_delivers_their_feedback(make_api):
    api = make_api(scopes=SCOPES["log_and_feedback.py"])
    result = run_example("log_and_feedback.py", url=api.url, key=api.key)
    interactions = Interaction.objects.filter(tenant=api.tenant)
    assert interactions.count() == 4 and {i.source for i in interactions} == {"logged"}
    first = interactions.get(client_id__endswith="-0")
    assert (first.end_user_id, first.completion_logprobs[0]) == ("dev-1", -0.05)
    outcomes = {
        row.interaction.client_id.rsplit("-", 1)[1]: (row.outcome, row.kept_text)
        for row in Feedback.objects.filter(interaction__tenant=api.tenant).select_related("interaction")
    }
    assert outcomes == {
        "0": ("accepted", ""),
        "1": ("rejected", ""),
        "2": ("edited", "total = 0.0"),
        "3": ("not_shown", ""),
    }
    assert f"logged interaction {first.pk}" in result.stdout
    assert "queued feedback: 3 delivered, 0 rejected, 0 failed, 0 dropped" in result.stdout


@pytest.mark.vllm
@pytest.mark.django_db(transaction=True)
def test_serve_through_strop_serves_a_completion_and_records_its_feedback(
    live_server, serving_tenant, serving_adapter, make_client, served
):
    key = make_client(serving_tenant, scopes=SCOPES["serve_through_strop.py"]).raw_key
    result = run_example("serve_through_strop.py", url=live_server.url, key=key)
    served_interaction = Interaction.objects.get(tenant=serving_tenant)
    assert (served_interaction.source, served_interaction.end_user_id) == ("served", "dev-42")
    expected = "accepted" if served_interaction.completion.strip() else "not_shown"
    assert served_interaction.feedback.get().outcome == expected
    assert f"completion {served_interaction.pk} from {served.served_model_name}" in result.stdout


@pytest.mark.vllm
@pytest.mark.django_db(transaction=True)
def test_manage_an_experiment_runs_one_on_the_newest_candidate_and_stops_it(
    live_server, serving_tenant, serving_adapter, make_client, probed_version
):
    probed_version(seed=61)
    newest = probed_version(seed=62)
    key = make_client(serving_tenant).raw_key
    result = run_example("manage_an_experiment.py", url=live_server.url, key=key)
    experiment = Experiment.objects.get(tenant=serving_tenant)
    assert (experiment.candidate_version_id, experiment.status) == (newest.pk, "stopped")
    assert ExperimentExposure.objects.filter(experiment=experiment).count() == 4
    assert ExperimentSnapshot.objects.filter(experiment=experiment).get().users == 4
    serving_adapter.refresh_from_db()
    assert serving_adapter.production_version is None  # stopping changes nothing in production
    assert f"stopped experiment {experiment.pk}: stopped; production is the base model" in result.stdout


@pytest.mark.django_db(transaction=True)
def test_manage_an_experiment_says_so_and_fails_without_a_candidate(api, tab_adapter):
    result = run_example("manage_an_experiment.py", url=api.url, key=api.key, exit_status=1)
    assert "no candidate version" in result.stdout
    assert not Experiment.objects.filter(tenant=api.tenant).exists()
