"""Retained characters in an experiment: each arm's users' accepted and retained characters from
persistence reports (each completion at its latest checkpoint), the two metrics built on them, and
the experiment page showing them."""

from __future__ import annotations

import pytest

from apps.experiments.arm_data import experiment_arm_data
from apps.experiments.models import ExperimentExposure
from apps.experiments.services import experiment_snapshot_take
from apps.experiments.stats import METRICS
from apps.interactions.services import interactions_ingest, persistence_ingest
from tests.dashboard.routes import url_for

pytestmark = pytest.mark.django_db


def accepted(world, user: str, name: str, completion: str, readings: dict[int, str]) -> None:
    """A completion for ``user``, accepted, and what was left of it at each checkpoint."""
    item = {"client_id": name, "prompt": "def f():\n    ", "completion": completion, "end_user_id": user}
    (result,) = interactions_ingest(world.a, items=[{**item, "opted_in": True}])
    assert result.status == "created"
    reports = [{"client_id": name, "checkpoint_s": c, "text": text} for c, text in readings.items()]
    assert all(r.status == "recorded" for r in persistence_ingest(world.a, items=reports))


def test_retained_characters_are_summed_per_user_at_the_latest_checkpoint_and_shown(world, login):
    arms = dict(
        ExperimentExposure.objects.filter(experiment=world.experiment).values_list("end_user__external_id", "arm")
    )
    control_user = next(u for u, a in arms.items() if a == "control")
    candidate_user = next(u for u, a in arms.items() if a == "candidate")
    # Control: kept at 30 s, deleted by 10 min. Candidate: edited a little, still there at 10 min.
    accepted(world, control_user, "k-1", "return 1", {30: "return 1", 600: ""})
    accepted(world, candidate_user, "k-2", "return 22", {600: "return 2", 30: "return 22"})
    accepted(world, candidate_user, "k-3", "pass", {})  # no report: adds nothing

    control, candidate = experiment_arm_data(world.experiment)
    assert (control.totals()["accepted_chars"], control.totals()["retained_chars"]) == (8, 0)
    assert (candidate.totals()["accepted_chars"], candidate.totals()["retained_chars"]) == (9, 8)
    assert {"retained_chars_per_request", "retained_share"} <= set(METRICS)

    experiment_snapshot_take(world.experiment.pk)
    page = login(world.users["viewer"]).get(url_for("experiment", world)).content.decode()
    assert "What developers kept" in page and "Retained share of accepted characters" in page
