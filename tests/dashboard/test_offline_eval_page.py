"""The versions page shows each candidate's offline evaluation on the tenant's eval set: base,
parent and candidate side by side with 95 % intervals and the lift, or says how to get one."""

from __future__ import annotations

import pytest

from apps.training.models import TrainingRun
from apps.training.services import eval_set_upload
from learning_shared.fim_metrics import CaseScore
from learning_shared.offline_eval import fim_figures
from tests.dashboard.routes import url_for

pytestmark = pytest.mark.django_db

RIGHT, HALF, WRONG = CaseScore(True, True, 1.0), CaseScore(True, False, 0.5), CaseScore(False, False, 0.25)


def _store_gate(world, **fields) -> None:
    """The run's verdict, as the pipeline stores it, with the FIM fields given."""
    TrainingRun.objects.filter(pk=world.run.pk).update(gate={**world.run.gate, **fields})


def test_the_candidates_figures_are_shown_against_its_parent_and_the_base_with_intervals_and_lift(login, world):
    scores = {
        "candidate": [RIGHT] * 9 + [HALF] * 3,
        "parent": [RIGHT] * 3 + [HALF] * 3 + [WRONG] * 6,
        "base": [WRONG] * 12,
    }
    _store_gate(world, fim_check="passed", fim_count=12, fim_figures=fim_figures(scores),
                fim_eval_set={"cases": 20, "uploaded_at": "2026-11-20T09:30:00+00:00"})
    body = login(world.users["viewer"]).get(url_for("versions", world)).content.decode()
    section = body[body.index('id="v2-offline"'):]
    assert "Offline evaluation on" in section and "your eval set" in section
    assert "12 cases (the first 12 of 20) of the set uploaded" in section and "2026-11-20 09:30" in section
    assert section.index("Base model") < section.index("Parent v1") < section.index("Candidate v2")
    assert "Accepted per request" in section and "Whole middle exact" in section and "Edit similarity" in section
    assert "100.0 %" in section and "50.0 %" in section  # candidate's and parent's first lines
    assert "+50.0 pp" in section and "offline-eval__lift--better" in section
    assert "accept v2's first line on <strong>100.0 %</strong> of requests, against 50.0 % for v1" in section
    assert "95 % interval" in section and "means only" not in section
    assert 'id="v1-offline"' not in body  # v1 was registered by hand: no gate, no evaluation


def test_a_verdict_stored_before_the_figures_shows_its_means(login, world):
    _store_gate(world, fim_check="passed", fim_count=6, fim_candidate={"exact_match": 0.5, "edit_similarity": 0.8},
                fim_parent={"exact_match": 1 / 3, "edit_similarity": 0.7})
    body = login(world.users["admin"]).get(url_for("versions", world)).content.decode()
    section = body[body.index('id="v2-offline"'):]
    assert "6 cases" in section and "50.0 %" in section and "+16.7 pp" in section and "+0.1" in section
    assert "not recorded" in section and "means only" in section and "would accept" not in section


def test_without_an_eval_set_the_page_asks_for_one_and_once_uploaded_says_the_next_candidate_uses_it(login, world):
    admin = login(world.users["admin"]).get(url_for("versions", world)).content.decode()
    eval_set_link = url_for("eval-set", world)
    assert "tab has no eval set" in admin and f'<a href="{eval_set_link}">Upload one</a>' in admin
    viewer = login(world.users["viewer"]).get(url_for("versions", world)).content.decode()
    assert "An admin can upload one" in viewer and "Upload one</a>" not in viewer
    cases = [{"prefix": "def f():\n    ", "suffix": "\n", "middle": "return 1"}] * 3
    eval_set_upload(world.a, adapter=world.adapter, cases=cases, actor="system")
    body = login(world.users["admin"]).get(url_for("versions", world)).content.decode()
    assert "evaluated before" in body and "on its 3 cases" in body and "has no eval set" not in body


def test_a_rejected_candidate_has_no_version_and_its_runs_page_shows_its_evaluation(login, world):
    from apps.training.services import training_run_advance, training_run_claim, training_run_start

    TrainingRun.objects.filter(pk=world.run.pk).update(status=TrainingRun.Status.CANDIDATE)  # finished
    run = training_run_claim(training_run_start(world.a, adapter=world.adapter, actor="system").pk, attempt=1)
    for status in (TrainingRun.Status.TRAINING, TrainingRun.Status.EVALUATING):
        training_run_advance(run, status=status)
    scores = {"candidate": [WRONG] * 8, "parent": [RIGHT] * 4 + [WRONG] * 4}
    reason = "FIM edit similarity 0.250 is below the parent's 0.625"
    gate = {"passed": False, "reasons": [reason], "fim_check": "failed", "fim_count": 8}
    gate["fim_figures"] = fim_figures(scores)
    training_run_advance(run, status=TrainingRun.Status.REJECTED, gate=gate)
    url = f"/dashboard/t/{world.a.slug}/runs/{run.pk}/"
    body = login(world.users["viewer"]).get(url).content.decode()
    section = body[body.index('id="run-offline"'):]
    assert run.parent_version == world.v2 and "Parent v2" in section and "Candidate</th>" in section
    assert "accept the candidate's first line on <strong>0.0 %</strong> of requests, against 50.0 % for v2" in section
    assert "−50.0 pp" in section and "offline-eval__lift--worse" in section


def test_the_gate_numbers_show_the_paired_difference_the_fim_check_decided_on(login, world):
    scores = {"candidate": [WRONG] * 6 + [HALF] * 2, "parent": [RIGHT] * 4 + [HALF] * 4}
    figures = fim_figures(scores)
    difference = figures["lift"]["edit_similarity"]
    _store_gate(world, fim_check="failed", fim_count=8, fim_figures=figures, fim_rule="paired",
                fim_interval={**difference, "bound": 0.0},
                fim_candidate={"exact_match": 0.0, "edit_similarity": 0.3125},
                fim_parent={"exact_match": 0.5, "edit_similarity": 0.75})
    url = f"/dashboard/t/{world.a.slug}/runs/{world.run.pk}/"
    body = login(world.users["viewer"]).get(url).content.decode()
    assert difference["high"] < 0
    assert "paired difference −0.438 [−0.728, −0.147]" in body
    assert "stopped only when the interval lies wholly below 0)" in body
    # Under 5 cases there is no interval: the row says the fixed margin decided.
    few = fim_figures({"candidate": [WRONG] * 4, "parent": [RIGHT] * 4})
    _store_gate(world, fim_check="failed", fim_count=4, fim_figures=few, fim_rule="margin",
                fim_interval={**few["lift"]["edit_similarity"], "bound": -0.02},
                fim_candidate={"exact_match": 0.0, "edit_similarity": 0.25},
                fim_parent={"exact_match": 1.0, "edit_similarity": 1.0})
    body = login(world.users["viewer"]).get(url).content.decode()
    assert "paired difference −0.75" in body and "under 5 cases, no interval: held to the fixed margin, −0.02" in body
