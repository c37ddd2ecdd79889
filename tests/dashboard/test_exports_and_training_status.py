"""CSV downloads (interactions with feedback, an experiment's results) and the training status page
(where an adapter's interactions went, and what the next run waits for)."""

from __future__ import annotations

import csv
import io

import pytest

from apps.adapters.services import adapter_create, base_model_register
from apps.cohorts.services import end_user_consent_set
from apps.interactions.models import Interaction
from apps.interactions.services import interactions_ingest
from apps.training.outlook import training_outlook
from apps.training.services import training_policy_update
from tests.dashboard.conftest import feed_experiment, log_events
from tests.dashboard.routes import url_for

pytestmark = pytest.mark.django_db


def _rows(response) -> list[dict[str, str]]:
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith("attachment; filename=")
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_the_interactions_download_holds_every_filtered_interaction_with_its_feedback_and_no_formula(world, login):
    hostile = "=HYPERLINK(\"http://evil.example\",\"click\")"
    log_events(world.a, outcomes=["accepted", "rejected", None], user="dev-csv", completion=hostile)
    client = login(world.users["viewer"])
    every = _rows(client.get(url_for("interactions-csv", world)))
    assert len(every) == Interaction.objects.filter(tenant=world.a).count()
    mine = [row for row in every if row["end_user_id"] == "dev-csv"]
    assert sorted(row["outcome"] for row in mine) == ["", "accepted", "rejected"]
    assert all(row["completion"] == "'" + hostile for row in mine)  # a spreadsheet shows it as text
    assert {row["kept_text"] for row in mine if row["outcome"]} == {"return a+b"}

    filtered = _rows(client.get(url_for("interactions-csv", world) + "?outcome=accepted&user=dev-csv"))
    assert [row["outcome"] for row in filtered] == ["accepted"]


def test_another_tenants_member_cannot_download_this_tenants_data(world, login, make_user):
    outsider = make_user("outsider", world.b, "owner")
    client = login(outsider)
    assert client.get(url_for("interactions-csv", world)).status_code == 404
    assert client.get(url_for("experiment-results-csv", world)).status_code == 404


def test_the_experiment_download_has_a_row_per_metric_of_the_latest_snapshot(world, login):
    feed_experiment(world, users=40)
    rows = _rows(login(world.users["viewer"]).get(url_for("experiment-results-csv", world)))
    metrics = world.experiment.snapshots.latest("computed_at").analysis["metrics"]
    assert [row["metric"] for row in rows] == [metric["name"] for metric in metrics]
    arms = world.experiment.snapshots.latest("computed_at").analysis["arms"]
    primary = next(row for row in rows if row["role"] == "primary")
    assert primary["decision"]
    assert (int(primary["control_users"]), int(primary["candidate_users"])) == (
        arms["control"]["users"],
        arms["candidate"]["users"],
    )
    assert float(primary["interval_low"]) <= float(primary["interval_high"])


def _logged(tenant, *, user: str, opted_in: bool, prompt: str = "def f():\n    ") -> str:
    result = interactions_ingest(
        tenant,
        items=[{"client_id": f"{user}-{prompt!r}", "prefix": prompt, "completion": "pass", "model": "tab",
                "end_user_id": user, "opted_in": opted_in}],
    )
    return result[0].id


def test_the_training_status_puts_each_interaction_in_one_bucket_and_says_what_the_next_run_waits_for(
    make_tenant, tiny_starter_model, make_user, login
):
    from apps.interactions.services import feedback_ingest

    tenant = make_tenant("status-t")
    base = base_model_register(name="starter-status", path=tiny_starter_model)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    training_policy_update(tenant, adapter=adapter, actor="test", changes={"min_new_events": 5})
    waiting = [_logged(tenant, user=f"in-{n}", opted_in=True) for n in range(3)]
    silent = _logged(tenant, user="in-silent", opted_in=True)  # no feedback
    refused = _logged(tenant, user="out-0", opted_in=False)
    withdrawn = _logged(tenant, user="in-later-out", opted_in=True)
    empty = _logged(tenant, user="in-empty", opted_in=True, prompt="")  # nothing to learn from
    feedback_ingest(
        tenant,
        items=[{"interaction_id": i, "outcome": "accepted"} for i in [*waiting, refused, withdrawn, empty]],
    )
    end_user_consent_set(tenant, external_id="in-later-out", opted_in=False, source="api", actor="test")
    assert silent

    outlook = training_outlook(adapter)
    assert (outlook.interactions, outlook.new, outlook.no_feedback) == (7, 3, 1)
    assert (outlook.no_consent, outlook.nothing_to_learn, outlook.already_trained) == (2, 1, 0)
    assert outlook.events_short == 2 and outlook.due_at is not None
    assert outlook.verdict.startswith("3 new events of the 5 that start a run; 2 more")

    viewer = make_user("status-viewer", tenant, "viewer")
    page = login(viewer).get(f"/dashboard/t/{tenant.slug}/adapters/tab/training-status/").content.decode()
    assert "3 new events of the 5 that start a run" in page
    assert "No consent" in page and "No feedback yet" in page and "Nothing to learn" in page

    training_policy_update(tenant, adapter=adapter, actor="test", changes={"enabled": False})
    assert "Automatic training is off" in training_outlook(adapter).verdict
