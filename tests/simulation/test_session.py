"""A session of simulated developers against the real API, through the SDK: pytest-django's
live server, the session's vLLM server on the tiny starter model, the real Postgres."""

from __future__ import annotations

import json
from collections import defaultdict

import httpx
import pytest
from strop import PermissionDeniedError, Strop

from apps.interactions.models import Feedback, Interaction
from benchmarks.simdev import REWARDS, deliver_feedback, load_tasks, respond, run_session

pytestmark = pytest.mark.django_db(transaction=True)

USERS = ["dev-a", "dev-b", "dev-c"]


class CompletionBodies:
    """What the SDK sent to /v1/completions, read from an httpx event hook (nothing intercepted)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> None:
        if request.url.path == "/v1/completions":
            self.bodies.append(json.loads(request.content))


@pytest.mark.vllm
@pytest.mark.parametrize("population", ["line", "block"])
def test_every_request_gets_one_feedback_event_with_its_outcome_and_the_figures_match_the_database(
    population, live_server, served, serving_tenant, serving_adapter, make_client
):
    key = make_client(serving_tenant, scopes=["serve", "feedback"]).raw_key
    tasks = load_tasks("eval", 12, seed=0)
    sent = CompletionBodies()
    http = httpx.Client(base_url=live_server.url, event_hooks={"request": [sent]})
    with http, Strop(base_url=live_server.url, api_key=key, timeout=120, http_client=http) as client:
        # The line population's feedback goes separately, as the freshness benchmark sends it.
        result = run_session(
            client, tasks, population, users=USERS, max_tokens=12, concurrency=2, send_feedback=population == "block"
        )
        if population == "line":
            assert not Feedback.objects.exists()
            assert deliver_feedback(client, result.feedback_items(), batch_size=5) == 12
    assert population == "line" or result.feedback_recorded == 12

    assert len(sent.bodies) == 12 and all("stop" not in body for body in sent.bodies)
    assert {(b["max_tokens"], b["opted_in"]) for b in sent.bodies} == {(12, True)}
    by_id = {request.interaction_id: request for request in result.requests}
    assert [r.task_id for r in result.requests] == [t.id for t in tasks] and len(by_id) == 12
    interactions = list(Interaction.objects.filter(pk__in=by_id))
    feedback_of: dict[str, list[Feedback]] = defaultdict(list)
    for feedback in Feedback.objects.all():
        feedback_of[str(feedback.interaction_id)].append(feedback)
    assert len(interactions) == 12 and set(feedback_of) == set(by_id)
    for interaction in interactions:
        request = by_id[str(interaction.pk)]
        task = tasks[request.index]
        assert (interaction.prefix, interaction.suffix) == (task.prefix, task.suffix_for(population))
        assert (interaction.end_user_id, interaction.end_user_opted_in) == (USERS[request.index % 3], True)
        assert (interaction.completion, interaction.model_name) == (request.text, request.version)
        (feedback,) = feedback_of[str(interaction.pk)]
        assert feedback.events_received == 1 and feedback.metadata == {"population": population, "task": task.id}
        decision = respond(population, interaction.completion, task)
        assert feedback.outcome == request.outcome == decision.outcome
        # What the developer took or kept reaches Strop as the editor reports it.
        assert feedback.accepted_chars == request.accepted_chars == decision.accepted_chars
        assert (feedback.kept_text or None) == request.kept_text == decision.kept_text
        # The tiny model rarely ends at once: not_shown is checked wherever its text is blank.
        assert (feedback.outcome == "not_shown") is (not interaction.completion.strip())

    rows: dict[str, list[str]] = defaultdict(list)
    for interaction in interactions:
        rows[interaction.model_name].append(feedback_of[str(interaction.pk)][0].outcome)
    summaries = result.by_version()
    assert set(summaries) == set(rows)
    for version, outcomes in rows.items():
        summary = summaries[version]
        shown = sum(o != "not_shown" for o in outcomes)
        accepted = outcomes.count("accepted")
        assert (summary.requests, summary.shown, summary.accepted) == (len(outcomes), shown, accepted)
        assert summary.shown_per_request.value == shown / len(outcomes)
        assert summary.accepted_per_request.value == accepted / len(outcomes)
        assert summary.accept_rate.n == shown
        assert summary.mean_reward.value == pytest.approx(sum(REWARDS[o] for o in outcomes) / len(outcomes))


def test_a_failed_completion_stops_the_session_before_any_feedback(live_server, make_tenant, make_client):
    key = make_client(make_tenant("no-serve"), scopes=["feedback"]).raw_key
    with Strop(base_url=live_server.url, api_key=key, timeout=30) as client:
        with pytest.raises(PermissionDeniedError):
            run_session(client, load_tasks("eval", 3), "line", users=USERS, concurrency=2)
    assert not Interaction.objects.exists() and not Feedback.objects.exists()
