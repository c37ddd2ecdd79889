"""The experiment, versions-rollback and cohorts pages: what they say and what their forms do.

Permissions (viewer 403, tenant B 404, the audit row of each action) are checked for every route
in test_walls.py; these tests read the pages."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from apps.cohorts.models import EndUser
from apps.experiments.models import Experiment
from apps.tenants.models import AuditEvent
from tests.dashboard.conftest import feed_experiment
from tests.dashboard.routes import ACTIONS, url_for

pytestmark = pytest.mark.django_db


def test_the_experiment_page_shows_both_arms_every_metric_and_the_decision(login, world):
    snapshot = feed_experiment(world)
    assert snapshot.action == "promote"
    body = login(world.users["viewer"]).get(url_for("experiment", world)).content.decode()
    assert 'data-stat="decision">Promote the candidate' in body
    assert "Candidate is significantly better on reward_per_request" in body
    assert 'data-stat="users-control">21<' in body and 'data-stat="users-candidate">21<' in body
    assert 'data-stat="srm">SRM: OK' in body
    for name in ("reward_per_request", "accept_rate", "accepted_per_request", "slow_request_share", "error_rate"):
        assert f'data-metric="{name}"' in body
    primary = re.search(r'data-metric="reward_per_request".*?</tr>', body, re.S).group(0)
    assert "chart--lift-better" in primary and "significantly better" in primary
    assert 'svg class="chart chart--band"' in body  # the lift over time with its band
    assert 'hx-trigger="every 5s"' in body
    assert "Promote v2…" not in body  # a viewer sees no action


def test_a_metric_with_too_few_effective_users_says_it_cannot_be_tested_yet(login, world):
    snapshot = feed_experiment(world, users=20)  # about 10 effective users per arm, under the 20 needed
    assert snapshot.action == "keep_running"
    body = login(world.users["viewer"]).get(url_for("experiment", world)).content.decode()
    assert "reward_per_request cannot be tested yet:" in body
    primary = re.search(r'data-metric="reward_per_request".*?</tr>', body, re.S).group(0)
    assert "not testable yet:" in primary and "effective users" in primary
    assert "significantly better" not in primary


def test_an_admin_sees_the_actions_with_the_recommended_one_highlighted(login, world):
    feed_experiment(world)
    body = login(world.users["admin"]).get(url_for("experiment", world)).content.decode()
    assert re.search(r'class="btn btn--primary" href="[^"]+/promote/">Promote v2…', body)
    assert "Roll back…" in body and "Stop…" in body


def test_the_live_fragment_is_the_statistics_alone_and_stops_polling_once_the_experiment_ends(login, world):
    client = login(world.users["admin"])
    body = client.get(url_for("experiment-live", world)).content.decode()
    assert body.lstrip().startswith('<div id="experiment-live"') and "<html" not in body
    assert "Waiting for the first snapshot" not in body  # the world took one
    client.post(url_for("experiment-stop", world), {"reason": "enough"})
    body = client.get(url_for("experiment-live", world)).content.decode()
    assert "hx-trigger" not in body and "Stopped" in body and "enough" in body


def test_the_promote_confirmation_states_what_changes_and_the_statistics(login, world):
    feed_experiment(world)
    body = login(world.users["admin"]).get(url_for("experiment-promote", world)).content.decode()
    assert "moves from <strong>v1</strong> to <strong>v2</strong>" in body
    assert "Every user — opted in or not, in either arm — is served v2" in body
    assert "<code>experiment.promote</code>" in body and "The statistics say:" in body
    assert "do not recommend this yet" not in body


def test_rolling_back_an_experiment_retires_the_candidate_and_keeps_production(login, world):
    client = login(world.users["admin"])
    response = client.post(url_for("experiment-rollback", world), {"reason": "too slow"}, follow=True)
    body = response.content.decode()
    assert "Rolled back: v2 is retired; v1 stays in production." in body
    world.experiment.refresh_from_db()
    world.v2.refresh_from_db()
    world.adapter.refresh_from_db()
    assert (world.experiment.status, world.experiment.decision, world.v2.status) == ("decided", "rollback", "retired")
    assert world.adapter.production_version_id == world.v1.pk
    event = AuditEvent.objects.get(tenant=world.a, action="experiment.rollback")
    assert event.data["reason"] == "too slow" and event.data["stats"]["decision"]["action"]


def test_an_action_on_an_ended_experiment_changes_nothing_and_says_why(login, world):
    client = login(world.users["admin"])
    client.post(url_for("experiment-stop", world))
    audits = AuditEvent.objects.filter(tenant=world.a).count()
    assert "there is nothing to rollback" in client.get(url_for("experiment-rollback", world)).content.decode()
    body = client.post(url_for("experiment-rollback", world), follow=True).content.decode()
    assert "Nothing changed: experiment" in body and "is stopped, not running" in body
    assert AuditEvent.objects.filter(tenant=world.a).count() == audits


def test_the_start_form_puts_each_error_beside_its_field_and_creates_nothing(login, world):
    from apps.adapters.services import adapter_version_register

    adapter_version_register(world.a, adapter=world.adapter, source_dir=world.v2.artifact_path, enqueue_load=False)
    client = login(world.users["admin"])
    data = {
        **ACTIONS["experiment-new"][1],
        "candidate_version": "9",
        "candidate_weight": "1.5",
        "guardrails": ["reward_per_request"],
    }
    response = client.post(url_for("experiment-new", world), data)
    assert response.status_code == 400
    body = response.content.decode()
    weight = re.search(r'<div class="field field--error">\s*<label for="id_candidate_weight".*?</div>', body, re.S)
    assert weight and "less than or equal to 0.99" in weight.group(0)
    assert "The primary metric cannot also be a guardrail" in body
    assert "Select a valid choice. 9 is not one of the available choices." in body
    assert Experiment.objects.filter(tenant=world.a).count() == 1


def test_the_start_form_refuses_while_an_experiment_runs(login, world):
    from apps.adapters.services import adapter_version_register

    adapter_version_register(world.a, adapter=world.adapter, source_dir=world.v2.artifact_path, enqueue_load=False)
    client = login(world.users["admin"])
    body = client.get(url_for("experiment-new", world)).content.decode()
    assert "is already running on tab" in body
    assert Experiment.objects.filter(tenant=world.a).count() == 1


def test_the_start_form_posted_while_an_experiment_runs_refuses_before_making_a_draft(login, world):
    from apps.adapters.services import adapter_version_register

    adapter_version_register(world.a, adapter=world.adapter, source_dir=world.v2.artifact_path, enqueue_load=False)
    audits = AuditEvent.objects.filter(tenant=world.a).count()

    response = login(world.users["admin"]).post(url_for("experiment-new", world), ACTIONS["experiment-new"][1])

    assert response.status_code == 400
    errors = response.content.decode().split('class="message message--error" role="alert">', 1)[1]
    assert f"experiment {world.experiment.pk} is already running on tab; stop it first" in errors.split("</div>")[0]
    assert list(Experiment.objects.filter(tenant=world.a)) == [world.experiment]
    assert AuditEvent.objects.filter(tenant=world.a).count() == audits


def test_the_experiments_list_pages_older_experiments_and_says_how_many_there_are(login, world):
    from apps.adapters.services import adapter_version_register
    from apps.experiments.services import experiment_create

    v3 = adapter_version_register(world.a, adapter=world.adapter, source_dir=world.v2.artifact_path, enqueue_load=False)
    drafts = [
        experiment_create(world.a, adapter=world.adapter, candidate_version=v3, actor="system") for _ in range(50)
    ]
    client = login(world.users["viewer"])

    first = client.get(url_for("experiments", world))
    older = client.get(url_for("experiments", world), {"page": "2"})

    assert [e.pk for e in first.context["experiments"]] == [d.pk for d in reversed(drafts)]
    assert "Page 1 of 2 · 51 in all" in first.content.decode()
    assert [e.pk for e in older.context["experiments"]] == [world.experiment.pk]  # the oldest is still listed


def test_the_experiments_list_shows_the_running_one(login, world):
    body = login(world.users["viewer"]).get(url_for("experiments", world)).content.decode()
    assert f"experiment #{world.experiment.pk}</a>, v2 against v1" in body
    assert "New experiment…" not in body


def test_the_versions_page_offers_a_rollback_to_earlier_versions_only(login, world):
    from apps.adapters.services import adapter_version_promote

    client = login(world.users["admin"])
    assert "Roll back to" not in client.get(url_for("versions", world)).content.decode()  # v1 is production
    adapter_version_promote(world.a, version=world.v2, actor="system")
    body = client.get(url_for("versions", world)).content.decode()
    assert "Roll back to v1…" in body and "Roll back to v2" not in body
    confirm = client.get(url_for("version-rollback", world)).content.decode()
    assert "moves back from <strong>v2</strong> to <strong>v1</strong>" in confirm
    assert "is stopped first" in confirm  # the running experiment


def test_the_cohorts_page_counts_charts_and_finds_end_users(login, world):
    client = login(world.users["viewer"])
    body = client.get(url_for("cohorts", world)).content.decode()
    assert 'data-stat="opted-in">2<' in body and 'svg class="chart chart--line"' in body
    found = client.get(url_for("cohorts", world) + "?q=dev-2").content.decode()
    assert "?end_user_id=dev-2" in found and "?end_user_id=dev-1" not in found
    none = client.get(url_for("cohorts", world) + "?q=nobody").content.decode()
    assert "No end user matches" in none


def test_the_end_user_page_shows_state_history_assignment_and_interactions(login, world):
    body = login(world.users["viewer"]).get(url_for("end-user", world)).content.decode()
    assert 'data-stat="consent">Opted in' in body
    assert f"#{world.experiment.pk}</a>" in body and "badge--arm-control" in body
    assert "return a + b" in body and "Opt out" not in body  # a viewer reads only


def test_opting_out_then_in_writes_history_and_audit(login, world):
    client = login(world.users["admin"])
    url = url_for("end-user-consent", world)
    body = client.post(url, {"end_user_id": "dev-1", "opted_in": "false"}, follow=True).content.decode()
    assert "dev-1 is opted out" in body and 'data-stat="consent">Opted out' in body
    client.post(url, {"end_user_id": "dev-1", "opted_in": "true"})
    user = EndUser.objects.get(tenant=world.a, external_id="dev-1")
    assert user.opted_in
    sources = list(user.consent_history.order_by("changed_at", "id").values_list("opted_in", "source"))
    assert sources[-2:] == [(False, "dashboard"), (True, "dashboard")]
    assert AuditEvent.objects.filter(tenant=world.a, action__in=["end_user.opt_out", "end_user.opt_in"]).count() == 2


def test_the_erase_confirmation_counts_what_will_go_and_erasing_removes_it(login, world):
    client = login(world.users["admin"])
    confirm = client.get(url_for("end-user-erase", world)).content.decode()
    assert 'data-erase="interactions">0<' in confirm and "No adapter version trained" in confirm
    body = client.post(url_for("end-user-erase", world), {"end_user_id": "dev-2"}, follow=True).content.decode()
    assert "Erased dev-2: 0 feedback, 0 pending feedback, 0 interactions" in body and "1 exposures" in body
    assert not EndUser.objects.filter(tenant=world.a, external_id="dev-2").exists()
    assert client.get(url_for("end-user-erase", world)).status_code == 404  # nothing left to erase


def test_an_unknown_or_missing_end_user_is_a_404(login, world):
    client = login(world.users["admin"])
    base = url_for("cohorts", world) + "user/"
    assert client.get(base).status_code == 404
    assert client.get(base + "?end_user_id=nobody").status_code == 404
    assert client.post(url_for("end-user-consent", world), {"end_user_id": "nobody"}).status_code == 404


def test_the_overview_links_the_running_experiment_and_its_decision(login, world):
    feed_experiment(world)
    body = login(world.users["viewer"]).get(url_for("overview-live", world)).content.decode()
    assert f'experiments/{world.experiment.pk}/">#{world.experiment.pk}: v2</a>' in body
    assert "says <strong>promote the candidate</strong>" in body


def test_a_draft_offers_start_with_a_confirmation_and_a_running_one_does_not(login, world):
    from apps.adapters.services import adapter_version_register
    from apps.experiments.services import experiment_create, experiment_stop

    client = login(world.users["admin"])
    assert "there is nothing to start" in client.get(url_for("experiment-start", world)).content.decode()
    experiment_stop(world.a, experiment=world.experiment, actor="system")
    v3 = adapter_version_register(world.a, adapter=world.adapter, source_dir=world.v2.artifact_path, enqueue_load=False)
    world.experiment = experiment_create(
        world.a, adapter=world.adapter, candidate_version=v3, actor="system", candidate_weight=0.3
    )
    page = client.get(url_for("experiment", world)).content.decode()
    assert "Draft: not started" in page and "Start…" in page and "hx-trigger" not in page
    confirm = client.get(url_for("experiment-start", world)).content.decode()
    assert "checks that vLLM serves exactly its weights" in confirm and "Then 30 % of tab" in confirm


def test_the_page_shows_the_lift_adjusted_for_users_history_beside_the_unadjusted_one(login, world):
    from apps.experiments.arm_data import experiment_arm_data
    from tests.dashboard.conftest import log_events

    # Three users in four used production the day before: some accept more than others.
    for index in range(40):
        if index % 4 == 3:
            continue
        accepted = 1 + index % 4
        outcomes: list[str | None] = ["accepted"] * accepted + ["rejected"] * (4 - accepted)
        log_events(world.a, outcomes=outcomes, user=f"sim-{index:04d}", minutes_ago=60 * 24)
    feed_experiment(world)

    control, candidate = experiment_arm_data(world.experiment)
    assert control.covariates is not None and candidate.covariates is not None
    with_history = int(control.covariates[:, -1].sum() + candidate.covariates[:, -1].sum())
    assert candidate.covariates[:, -1].sum() == 10  # 1, 5, 9, ...: the odd ones are candidates
    assert with_history >= 30  # and the world's own users who used production before
    body = login(world.users["viewer"]).get(url_for("experiment", world)).content.decode()
    assert ">Adjusted lift</th>" in body
    assert f"corrected for {with_history} users' reward per request" in body
    cell = re.search(r'data-adjusted="reward_per_request">(.*?)</td>', body, re.S).group(1)
    assert "variance −" in cell and 'data-adjusted-p="reward_per_request">adjusted ' in body


def test_with_few_users_with_history_the_adjusted_lift_still_decides(login, world):
    """One estimator at every look (docs/experiments.md): no switch at some count of users. One
    user with history cannot pay for the covariates, so the fit uses none and neither the page nor
    the decision says the lift was adjusted."""
    from apps.experiments.arm_data import experiment_arm_data

    feed_experiment(world)
    control, candidate = experiment_arm_data(world.experiment)
    with_history = int(control.covariates[:, -1].sum() + candidate.covariates[:, -1].sum())
    assert with_history == 1  # one of the world's own users used production before
    body = login(world.users["viewer"]).get(url_for("experiment", world)).content.decode()
    assert "Only 1 user had traffic on production before their first exposure: too few to fit" in body
    assert "corrected for" not in body
    assert "adjusted for pre-exposure behaviour" not in body


def test_with_nobody_with_history_the_page_says_the_adjusted_lift_is_the_unadjusted_one(login, world):
    from apps.experiments.models import ExperimentExposure
    from apps.experiments.services import experiment_snapshot_take

    feed_experiment(world)
    ExperimentExposure.objects.filter(experiment=world.experiment).update(
        history_requests=0, history_shown=0, history_accepted=0, history_reward=0.0
    )  # the frozen sums are what snapshots read
    experiment_snapshot_take(world.experiment.pk)
    body = login(world.users["viewer"]).get(url_for("experiment", world)).content.decode()
    assert "the adjusted lift, which decides, equals the unadjusted one" in body
    assert "adjusted for pre-exposure behaviour" not in body


def test_the_experiments_pages_show_alarms_and_the_lineage_against_its_holdout(login, world):
    from apps.adapters.models import Adapter
    from apps.experiments.models import PromotionAlarm, PromotionWatch
    from apps.experiments.services import holdout_snapshot_take

    Adapter.objects.filter(pk=world.adapter.pk).update(holdout_share=0.1)
    world.adapter.refresh_from_db()
    PromotionAlarm.objects.create(
        tenant=world.a,
        adapter=world.adapter,
        version=world.v2,
        metric="suggestion_rate",
        reference="holdout",
        observed=0.06,
        reference_value=0.6,
        relative_change=-0.9,
        reason="v2 of tab shows suggestions shown per request 0.06 since its promotion against 0.6.",
    )
    holdout_snapshot_take(world.adapter)
    reason = "Too few effective users: 60.0 for the holdout (base model), 3.2 for v1 (minimum 20 a side)"
    PromotionWatch.objects.create(
        tenant=world.a,
        adapter=world.adapter,
        version=world.adapter.production_version,
        promoted_at=timezone.now(),
        reference="holdout",
        checked_at=timezone.now(),
        metrics=[
            {
                "metric": "suggestion_rate",
                "label": "suggestions shown per request",
                "status": "too_few_effective_users",
                "reason": reason,
            }
        ],
    )
    client = login(world.users["viewer"])
    body = client.get(url_for("experiments", world)).content.decode()
    assert 'data-alarm="suggestion_rate"' in body and "Alarm on v2" in body and "Automatic rollback is off" in body
    assert 'data-section="holdout"' in body and "10 % of the opted-in users stay on the base model" in body
    row = re.search(r'data-holdout-metric="suggestion_rate".*?</tr>', body, re.S).group(0)
    assert re.search(r"too few effective users, [\d.,]+ in the holdout and [\d.,]+ on production", row)
    watched = re.search(r'data-watch-metric="suggestion_rate".*?</li>', body, re.S).group(0)
    assert 'data-watch-status="too_few_effective_users"' in watched and reason in watched
    body = client.get(url_for("experiment", world)).content.decode()
    assert 'data-alarm="suggestion_rate"' in body


def test_an_admin_sets_the_holdout_on_the_experiments_page_and_a_bad_one_changes_nothing(login, world):
    client = login(world.users["admin"])
    body = client.get(url_for("experiments", world)).content.decode()
    assert 'name="holdout_percent"' in body
    response = client.post(url_for("experiments-holdout", world), {"holdout_percent": "80"}, follow=True)
    assert "Nothing changed: the holdout: must be between 0 and 0.5" in response.content.decode()
    world.adapter.refresh_from_db()
    assert world.adapter.holdout_share == 0
    response = client.post(url_for("experiments-holdout", world), {"holdout_percent": "5"}, follow=True)
    assert "a new holdout would move users it exposed out of their arm" in response.content.decode()
    from apps.experiments.services import experiment_stop

    experiment_stop(world.a, experiment=world.experiment, actor="test")
    response = client.post(url_for("experiments-holdout", world), {"holdout_percent": "5"}, follow=True)
    assert "now keeps 5% of its opted-in users on the base model" in response.content.decode()
    world.adapter.refresh_from_db()
    assert world.adapter.holdout_share == 0.05
    assert AuditEvent.objects.filter(tenant=world.a, action="adapter.holdout").count() == 1
    viewer = login(world.users["viewer"]).get(url_for("experiments", world)).content.decode()
    assert 'name="holdout_percent"' not in viewer


def test_a_holdout_under_one_percent_is_said_and_prefilled_exactly_not_rounded_to_zero(login, world):
    from apps.experiments.services import experiment_stop

    experiment_stop(world.a, experiment=world.experiment, actor="test")
    client = login(world.users["admin"])

    response = client.post(url_for("experiments-holdout", world), {"holdout_percent": "0.5"}, follow=True)

    body = response.content.decode()
    assert "tab now keeps 0.5% of its opted-in users on the base model" in body
    assert re.search(r'<input id="holdout-percent" name="holdout_percent" [^>]*value="0.5"', body)
    assert "0.5 % of the opted-in users stay on the base model" in body
    world.adapter.refresh_from_db()
    assert world.adapter.holdout_share == 0.005
