"""The snapshot's read of every exposure (apps.experiments.arm_data): each user's sums land on
that user's row of their arm, whatever the order the database returns them in; rows of users not
exposed stay out; and on Postgres the numbers come back as binary arrays, read whole."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.db import connection
from django.utils import timezone

from apps.cohorts.models import EndUser
from apps.experiments import arm_data
from apps.experiments.arm_data import binary_copy_arrays, experiment_arm_data, numbers
from apps.experiments.models import ExperimentExposure
from apps.interactions.models import ServingFailure
from tests.fixtures.interactions import interaction_with_feedback

pytestmark = pytest.mark.django_db

postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="Postgres' binary COPY")


def _served(tenant, experiment, user: str, arm: str, *, outcomes: list[str | None], at) -> None:
    for i, outcome in enumerate(outcomes):
        interaction_with_feedback(
            tenant, user, at=at + timedelta(seconds=i), outcome=outcome, source="served", experiment=experiment,
            experiment_arm=arm, latency_ms=10.0,
        )  # fmt: skip


def test_each_users_sums_land_on_their_own_row(tenant, make_running_experiment) -> None:
    experiment = make_running_experiment(tenant, "tab", is_default=True)
    now = timezone.now()
    # users 0..9 exposed, alternately control and candidate; user i has i requests, the first accepted,
    # and dev-3 a serving failure besides; their history's reward per request, i / 2, names their row
    for i in range(10):
        user = EndUser.objects.create(tenant=tenant, external_id=f"dev-{i}", opted_in=True)
        arm = "control" if i % 2 == 0 else "candidate"
        ExperimentExposure.objects.create(
            tenant=tenant, experiment=experiment, end_user=user, arm=arm, first_exposed_at=now, history_frozen_at=now,
            history_requests=2, history_shown=0, history_accepted=0, history_reward=float(i),
        )  # fmt: skip
        _served(tenant, experiment, f"dev-{i}", arm, outcomes=(["accepted"] + [None] * (i - 1)) if i else [], at=now)
    ServingFailure.objects.create(
        tenant=tenant, adapter=experiment.adapter, experiment=experiment, experiment_arm="candidate",
        end_user_id="dev-3", kind="vllm_unavailable", occurred_at=now,
    )  # fmt: skip
    # served to someone with no exposure row (erased meanwhile), and to dev-2 under the other arm
    _served(tenant, experiment, "ghost", "control", outcomes=["accepted"] * 5, at=now)
    _served(tenant, experiment, "dev-2", "candidate", outcomes=["accepted"] * 7, at=now)

    control, candidate = experiment_arm_data(experiment)

    for arm, first in ((control, 0), (candidate, 1)):
        assert arm.users == 5
        who = [round(rate * 2) for rate in arm.covariates[:, 0]]  # history reward per request: i / 2
        assert sorted(who) == list(range(first, 10, 2))
        for row, i in enumerate(who):
            assert (arm.requests[row], arm.accepted[row], arm.errors[row]) == (i + (i == 3), int(i > 0), i == 3), i
    assert control.requests.sum() == sum(range(0, 10, 2))  # neither the ghost's nor dev-2's other-arm rows


def test_rows_are_matched_by_user_not_by_position(tenant, make_running_experiment, monkeypatch) -> None:
    """The exposures come back in any order (here: reversed), and so do the per-user parts."""
    experiment = make_running_experiment(tenant, "tab", is_default=True)
    now = timezone.now()
    for i in range(6):
        user = EndUser.objects.create(tenant=tenant, external_id=f"u{i}", opted_in=True)
        ExperimentExposure.objects.create(
            tenant=tenant, experiment=experiment, end_user=user, arm="control", first_exposed_at=now,
            history_frozen_at=now, history_requests=i, history_shown=i, history_accepted=0, history_reward=float(i * i),
        )  # fmt: skip
        _served(tenant, experiment, f"u{i}", "control", outcomes=[None] * (10 * i), at=now)
    read = numbers
    monkeypatch.setattr(arm_data, "numbers", lambda *args: read(*args)[::-1])

    control, _ = experiment_arm_data(experiment)

    # user i > 0: history reward per request i, 10 i requests; u0 has no history (the pooled rate)
    rate, has_history = control.covariates[:, 0], control.covariates[:, -1]
    for row, requests in enumerate(control.requests):
        assert (has_history[row], requests) == ((1.0, 10.0 * rate[row]) if requests else (0.0, 0.0))


@postgres_only
def test_numbers_come_back_whole_across_array_groups() -> None:
    rows = 3 * arm_data._ARRAY_ROWS + 17
    table = numbers("SELECT g, g * 0.5 - 7, -g FROM generate_series(1, %s) AS g", [rows], 3)
    assert table.shape == (rows, 3)
    table = table[np.argsort(table[:, 0])]
    expected = np.arange(1, rows + 1, dtype=np.float64)
    assert np.array_equal(table[:, 0], expected)
    assert np.array_equal(table[:, 1], expected * 0.5 - 7)
    assert np.array_equal(table[:, 2], -expected)


@postgres_only
def test_no_rows_is_an_empty_table() -> None:
    assert numbers("SELECT g, g FROM generate_series(1, 0) AS g", [], 2).shape == (0, 2)


@postgres_only
def test_a_null_or_another_type_is_refused_not_misread() -> None:
    def copied(select: str) -> bytearray:
        data = bytearray()
        with connection.cursor() as cursor, cursor.cursor.copy(f"COPY ({select}) TO STDOUT (FORMAT BINARY)") as copy:
            for block in copy:
                data += block
        return data

    assert binary_copy_arrays(copied("SELECT ARRAY[1.5, 2.5]::float8[]"), 1).tolist() == [[1.5], [2.5]]
    with pytest.raises(ValueError, match="without nulls"):
        binary_copy_arrays(copied("SELECT ARRAY[1.5, NULL]::float8[]"), 1)
    with pytest.raises(ValueError, match="float8"):
        binary_copy_arrays(copied("SELECT ARRAY[1, 2]::int4[]"), 1)
    with pytest.raises(ValueError, match="fields"):
        binary_copy_arrays(copied("SELECT ARRAY[1.5]::float8[], ARRAY[2.5]::float8[]"), 1)
    with pytest.raises(ValueError, match="not a binary COPY"):
        binary_copy_arrays(bytearray(b"1\t2\n"), 1)
