"""The exposures per arm the dashboard shows are kept by the database as exposures are written
(``ExperimentArmCount``, migration experiments.0005): they agree with counting the rows after any
mix of first exposures, repeated ones, erased users, an arm moved, bulk inserts and an experiment
deleted, on Postgres and on the embedded SQLite (where a snapshot's read of the exposures runs
too)."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
from collections import Counter

import pytest
from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from apps.cohorts.models import EndUser
from apps.dashboard.experiment_results import exposures_per_arm
from apps.experiments.models import CANDIDATE, CONTROL, Experiment, ExperimentArmCount, ExperimentExposure
from apps.experiments.services import exposures as exposure_service
from apps.privacy.services import end_user_erase


def _counted(experiment: Experiment) -> dict[str, int]:
    rows = ExperimentExposure.objects.filter(experiment=experiment).values("arm").annotate(n=Count("id"))
    return {CONTROL: 0, CANDIDATE: 0, **{row["arm"]: row["n"] for row in rows}}


@pytest.mark.django_db(transaction=True)  # the triggers of each statement, committed as serving commits them
def test_kept_counts_agree_with_the_rows_through_a_random_mix_of_changes(tenant, monkeypatch, make_running_experiment):
    monkeypatch.setattr(exposure_service, "_exposed", {})  # the process's memo must not hide a repeat
    rng = random.Random(7)
    experiments = [make_running_experiment(tenant, "tab"), make_running_experiment(tenant, "chat")]
    users = [f"dev-{i}" for i in range(60)]
    most = 0
    for user in users:
        EndUser.objects.create(tenant=tenant, external_id=user, opted_in=True)
    for step in range(300):
        action = rng.random()
        experiment = rng.choice(experiments)
        if action < 0.6:  # a first exposure, or a repeat that records nothing
            exposure_service._exposed.clear()
            user = rng.choice(users)
            exposure_service.exposure_record(experiment, external_id=user, arm=rng.choice([CONTROL, CANDIDATE]))
        elif action < 0.66 and users:  # an erased user takes their exposures in every experiment
            user = users.pop(rng.randrange(len(users)))
            end_user_erase(tenant, external_id=user, actor="test")
        elif action < 0.8:  # an arm moved (no code does it today: a raw update must not break the count)
            exposure = ExperimentExposure.objects.filter(experiment=experiment).order_by("?").first()
            if exposure is not None:
                ExperimentExposure.objects.filter(pk=exposure.pk).update(
                    arm=CANDIDATE if exposure.arm == CONTROL else CONTROL
                )
        else:  # many at once (the bulk path a backfill or a benchmark's COPY takes)
            known = list(EndUser.objects.filter(tenant=tenant, external_id__in=users).values_list("pk", flat=True))
            ExperimentExposure.objects.bulk_create(
                [
                    ExperimentExposure(
                        tenant=tenant,
                        experiment=experiment,
                        end_user_id=pk,
                        arm=rng.choice([CONTROL, CANDIDATE]),
                        first_exposed_at=timezone.now(),
                    )
                    for pk in rng.sample(known, min(len(known), 5))
                ],
                ignore_conflicts=True,
            )
        for each in experiments:
            assert exposures_per_arm(each) == _counted(each), f"step {step}"
        most = max(most, sum(sum(_counted(e).values()) for e in experiments))
    assert most > 40  # the mix did expose people
    gone = experiments[0].pk
    experiments[0].delete()
    assert not ExperimentArmCount.objects.filter(experiment_id=gone).exists()
    assert exposures_per_arm(experiments[1]) == _counted(experiments[1])


SQLITE_MIX = """
from django.utils import timezone
from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.cohorts.models import EndUser
from apps.experiments.models import Experiment, ExperimentExposure
from apps.tenants.models import Tenant
tenant = Tenant.objects.create(name="embedded", slug="embedded")
base = BaseModel.objects.create(name="b", path="/nonexistent", family="qwen")
adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base)
version = AdapterVersion.objects.create(tenant=tenant, adapter=adapter, number=1, artifact_path="/x", vllm_name="v")
experiment = Experiment.objects.create(
    tenant=tenant, adapter=adapter, candidate_version=version, salt="s", status="running", created_by="t"
)
users = [EndUser.objects.create(tenant=tenant, external_id=f"u{i}", opted_in=True) for i in range(6)]
make = lambda user, arm: ExperimentExposure(
    tenant=tenant, experiment=experiment, end_user=user, arm=arm, first_exposed_at=timezone.now()
)
ExperimentExposure.objects.bulk_create([make(u, "control" if i % 2 else "candidate") for i, u in enumerate(users)])
ExperimentExposure.objects.bulk_create([make(users[0], "control")], ignore_conflicts=True)  # a repeat
users[1].delete()
ExperimentExposure.objects.filter(end_user=users[2]).update(arm="candidate")
from apps.experiments.arm_data import experiment_arm_data  # the snapshot's read of every exposure
control, candidate = experiment_arm_data(experiment)
print("arm users", len(control.requests), len(candidate.requests), control.covariates.shape)
"""


def test_the_embedded_sqlite_keeps_the_counts_too(tmp_path):
    database = tmp_path / "embedded.sqlite3"
    env = {**os.environ, "DEBUG": "1", "DATABASE_URL": f"sqlite:///{database}"}

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    manage("migrate", "-v0")
    assert "arm users 2 3 (2, 4)" in manage("shell", "-c", SQLITE_MIX)
    with sqlite3.connect(database) as db:
        kept = dict(db.execute("SELECT arm, exposures FROM experiments_experimentarmcount").fetchall())
        rows = Counter(arm for (arm,) in db.execute("SELECT arm FROM experiments_experimentexposure"))
        # u0 candidate, u1 (deleted), u2 moved to candidate, u3 control, u4 candidate, u5 control
        assert kept == dict(rows) == {"candidate": 3, "control": 2}
        db.execute("DELETE FROM experiments_experiment")
        assert db.execute("SELECT count(*) FROM experiments_experimentarmcount").fetchone()[0] == 0
