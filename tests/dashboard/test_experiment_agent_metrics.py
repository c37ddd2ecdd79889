"""Agents in an experiment: positive outcomes per turn and per session, dissatisfied follow-ups as a
guardrail, counted per user from chat turns and shown on the experiment's page."""

from __future__ import annotations

import pytest

from apps.experiments.arm_data import experiment_arm_data
from apps.experiments.models import Experiment, ExperimentExposure
from apps.experiments.services import experiment_snapshot_take
from apps.interactions.services import feedback_ingest, interactions_ingest
from tests.dashboard.routes import url_for

pytestmark = pytest.mark.django_db


def turns(world, user: str, session: str, outcomes: list[str]) -> None:
    items = [
        {
            "client_id": f"{session}-{n}",
            "messages": [{"role": "user", "content": f"step {n}"}],
            "completion": "done",
            "conversation_id": session,
            "turn": n,
            "end_user_id": user,
            "opted_in": True,
        }
        for n in range(len(outcomes))
    ]
    results = interactions_ingest(world.a, items=items)
    verdicts = [{"interaction_id": r.id, "outcome": o} for r, o in zip(results, outcomes, strict=True)]
    feedback_ingest(world.a, items=verdicts)


def test_agent_metrics_are_counted_per_user_and_shown(world, login):
    exposures = ExperimentExposure.objects.filter(experiment=world.experiment)
    arms = dict(exposures.values_list("end_user__external_id", "arm"))
    control_user = next(u for u, a in arms.items() if a == "control")
    candidate_user = next(u for u, a in arms.items() if a == "candidate")
    turns(world, control_user, "c-1", ["follow_up_dissatisfied", "follow_up_dissatisfied", "thumbs_down"])
    turns(world, control_user, "c-2", ["thumbs_up"])
    turns(world, candidate_user, "k-1", ["thumbs_up", "edit_persisted"])
    turns(world, candidate_user, "k-2", ["follow_up_dissatisfied", "thumbs_up"])

    control, candidate = experiment_arm_data(world.experiment)
    assert (control.totals()["positive"], control.totals()["dissatisfied"]) == (1, 2)
    assert (control.totals()["sessions"], control.totals()["positive_sessions"]) == (2, 1)
    assert (candidate.totals()["positive"], candidate.totals()["dissatisfied"]) == (3, 1)
    assert (candidate.totals()["sessions"], candidate.totals()["positive_sessions"]) == (2, 2)

    config = {**world.experiment.config, "secondary_metrics": ["positive_rate", "positive_session_rate"],
              "guardrails": ["dissatisfied_rate", "error_rate"]}
    Experiment.objects.filter(pk=world.experiment.pk).update(config=config)
    experiment_snapshot_take(world.experiment.pk)
    page = login(world.users["viewer"]).get(url_for("experiment", world)).content.decode()
    for label in ("Positive outcomes per turn", "Sessions with a positive outcome per session",
                  "Dissatisfied follow-ups per turn"):
        assert label in page, label
