"""Per-user sums of each arm, aggregated in the database, for the statistics.

Every exposed user is one row of their arm, also without a request yet. A request is a served
interaction of the experiment or a serving failure of it; a suggestion is *shown* when its
completion is not empty and the user's feedback says they saw it (accepted, rejected or
edited); *accepted* counts accepted ones; the reward is the adapter's reward policy applied to
the feedback (``apps.interactions.rewards``: no feedback yet is 0, as silence); *slow* requests
are those above the control arm's pooled p95 latency.

Each user also carries their behaviour before their first exposure: the same sums over the
tenant's production traffic (no experiment; logged interactions name no adapter, and any
behaviour before exposure is a valid covariate), frozen on the exposure row when the user was
exposed (``apps.experiments.history``), turned into the covariates of the regression-adjusted
lift (``stats.adjustment``).

A snapshot reads every exposure once, as numbers (its id, its arm, its frozen history), then each
per-user part (the sums over the experiment's interactions, serving failures and persistence
reports, grouped by the database) with the id of the exposure it belongs to, and places the part's
rows by that id: no Python step per exposure, and only the users with rows in a part are looked up
by their external id. A million exposures are a million rows; on Postgres they come back as float8
arrays in binary ``COPY``, which numpy reads whole (a cursor's fetch of them cost seconds).
"""

from __future__ import annotations

import struct

import numpy as np
from django.db import connection
from django.db.models import Count, F, Q, QuerySet, Sum, Value

from apps.cohorts.models import EndUser
from apps.experiments.history import history_freeze
from apps.experiments.models import CANDIDATE, CONTROL, Experiment, ExperimentExposure
from apps.experiments.retained import retained_per_user
from apps.experiments.stats import ArmData
from apps.experiments.stats.adjustment import history_covariates
from apps.interactions.models import SHOWN_OUTCOMES, Feedback, Interaction, ServingFailure
from apps.interactions.rewards import reward_expression, reward_table_for

# What counts as a good answer for the agents' metrics (positive_rate, positive_session_rate).
POSITIVE_OUTCOMES = (Feedback.Outcome.ACCEPTED, Feedback.Outcome.THUMBS_UP, Feedback.Outcome.EDIT_PERSISTED)

# The frozen pre-exposure sums of an exposure (``apps.experiments.history``).
HISTORY = ("requests", "shown", "accepted", "reward")
# The columns of each per-user part, as its queryset names them.
SERVED = (
    "requests",
    "shown",
    "accepted",
    "reward",
    "slow",
    "positive",
    "dissatisfied",
    "sessions",
    "positive_sessions",
)
FAILED = ("errors", "slow")
RETAINED = ("accepted", "retained")


def _p95(latencies: QuerySet[Interaction], experiment: Experiment, arm: str) -> float | None:
    rows = latencies.filter(experiment_arm=arm, latency_ms__isnull=False)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) FROM "
                f"{connection.ops.quote_name(Interaction._meta.db_table)} WHERE experiment_id = %s "
                f"AND experiment_arm = %s AND latency_ms IS NOT NULL",
                [experiment.pk, arm],
            )
            value = cursor.fetchone()[0]
        return float(value) if value is not None else None
    values = np.array(list(rows.values_list("latency_ms", flat=True)), dtype=np.float64)
    return float(np.percentile(values, 95)) if values.size else None


def _exposures(experiment: Experiment) -> tuple[str, list]:
    """Each exposure of the two arms: its id, 1 for the candidate's, its four frozen history sums
    (0 where not frozen: no history)."""
    sums = ", ".join(
        f"CASE WHEN e.history_frozen_at IS NULL THEN 0 ELSE COALESCE(e.history_{n}, 0) END" for n in HISTORY
    )
    return (
        f"SELECT e.id, CASE WHEN e.arm = %s THEN 1 ELSE 0 END, {sums} "
        f"FROM {connection.ops.quote_name(ExperimentExposure._meta.db_table)} e "
        f"WHERE e.experiment_id = %s AND e.arm IN (%s, %s)",
        [CANDIDATE, experiment.pk, CONTROL, CANDIDATE],
    )


def _part(experiment: Experiment, rows: QuerySet, names: tuple[str, ...]) -> tuple[str, list]:
    """A per-user part (grouped by ``part_arm`` and ``part_user``, the external id) with the id of
    the exposure it belongs to: its user's, in the same arm. Found through the (tenant, external
    id) and (experiment, end user) indexes, so only the part's own users are looked up; a row
    without such an exposure (served after an erase) is left out."""
    quote = connection.ops.quote_name
    sql, params = rows.query.sql_with_params()
    values = ", ".join(f"COALESCE(q.{quote(name)}, 0)" for name in names)
    return (
        f"SELECT e.id, {values} FROM ({sql}) q "
        f"JOIN {quote(EndUser._meta.db_table)} u ON u.tenant_id = %s AND u.external_id = q.part_user "
        f"JOIN {quote(ExperimentExposure._meta.db_table)} e "
        f"ON e.experiment_id = %s AND e.end_user_id = u.id AND e.arm = q.part_arm",
        [*params, experiment.tenant_id, experiment.pk],
    )


# Rows a group of arrays holds on Postgres: well below the 1 GB a value (and a COPY row) may take.
_ARRAY_ROWS = 65536
_FLOAT8 = 701  # Postgres' type oid of float8


def numbers(statement: str, params: list, width: int) -> np.ndarray:
    """The statement's rows, ``width`` numbers each (the first an integer key), as a (rows, width)
    float64 array. On Postgres the database gathers each column into float8 arrays (by groups of
    the key) and sends them as binary ``COPY``: a handful of messages numpy reads whole, where a
    cursor's fetch of a million rows builds a Python tuple and a float per value, and a row-wise
    ``COPY`` sends a message per row."""
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            cursor.execute(statement, params)
            return np.array(cursor.fetchall(), dtype=np.float64).reshape(-1, width)
        aggregates = ", ".join(f"array_agg(CAST(s.c{i} AS DOUBLE PRECISION))" for i in range(width))
        named = ", ".join(f"c{i}" for i in range(width))
        data = bytearray()
        # On the driver's cursor (Django's has no COPY): its errors still reach callers as Django's,
        # and a broken connection is marked so, as with every other statement.
        with (
            connection.wrap_database_errors,
            cursor.cursor.copy(
                f"COPY (SELECT {aggregates} FROM ({statement}) AS s ({named}) GROUP BY s.c0 / {_ARRAY_ROWS}) "
                f"TO STDOUT (FORMAT BINARY)",
                params,
            ) as copy,
        ):
            for block in copy:
                data += block
    return binary_copy_arrays(data, width)


def binary_copy_arrays(data: bytes | bytearray, width: int) -> np.ndarray:
    """Rows of ``width`` one-dimensional float8 arrays without nulls, in Postgres' binary ``COPY``
    format, as one (elements, width) array: the rows' arrays one after another, column by column.

    The stream: a 19-byte header (signature, flags, extension length) and the extension; per row a
    16-bit field count and per field a 32-bit length and the value; a 16-bit -1 at the end. An
    array value: dimensions, a null flag, the element type, per dimension its size and lower bound,
    then per element a 32-bit length and the big-endian float8."""
    if not bytes(data[:11]) == b"PGCOPY\n\xff\r\n\x00":
        raise ValueError("not a binary COPY stream")
    at = 19 + int.from_bytes(data[15:19], "big")
    element = np.dtype([("length", ">i4"), ("value", ">f8")])
    columns: list[list[np.ndarray]] = [[] for _ in range(width)]
    while (fields := int.from_bytes(data[at : at + 2], "big", signed=True)) != -1:
        if fields != width:
            raise ValueError(f"binary COPY row of {fields} fields, not {width}")
        at += 2
        for column in columns:
            length = int.from_bytes(data[at : at + 4], "big", signed=True)
            if length < 12:
                raise ValueError("binary COPY field is not a one-dimensional array without nulls")
            dims, has_nulls, of_type = struct.unpack_from(">iiI", data, at + 4)
            if has_nulls or dims > 1:
                raise ValueError("binary COPY field is not a one-dimensional array without nulls")
            if of_type != _FLOAT8:
                raise ValueError(f"binary COPY array of type {of_type}, not float8")
            count = struct.unpack_from(">i", data, at + 16)[0] if dims else 0
            values = np.frombuffer(data, dtype=element, count=count, offset=at + 16 + 8 * dims)
            if (values["length"] != 8).any() or length != 12 + 8 * dims + 12 * count:
                raise ValueError("binary COPY array elements are not float8")
            column.append(values["value"].astype(np.float64))
            at += 4 + length
    return np.column_stack([np.concatenate(c) if c else np.empty(0) for c in columns]).reshape(-1, width)


def experiment_arm_data(experiment: Experiment) -> tuple[ArmData, ArmData]:
    """(control, candidate) per-user sums, entry i of each the same exposed user, in a few grouped
    statements whatever the traffic (after freezing any exposure's history still unfrozen; one not
    frozen meanwhile counts as no history)."""
    interactions = Interaction.objects.filter(experiment=experiment)
    threshold = _p95(interactions, experiment, CONTROL)
    reward = reward_expression(reward_table_for(experiment.adapter))
    slow = Count("id", filter=Q(latency_ms__gt=threshold)) if threshold is not None else Value(0)
    served = (
        interactions.values(part_arm=F("experiment_arm"), part_user=F("end_user_id"))
        .annotate(
            requests=Count("id"),
            shown=Count("id", filter=~Q(completion="") & Q(feedback__outcome__in=SHOWN_OUTCOMES)),
            accepted=Count("id", filter=~Q(completion="") & Q(feedback__outcome=Feedback.Outcome.ACCEPTED)),
            reward=Sum(reward),
            slow=slow,
            positive=Count("id", filter=Q(feedback__outcome__in=POSITIVE_OUTCOMES)),
            dissatisfied=Count("id", filter=Q(feedback__outcome=Feedback.Outcome.FOLLOW_UP_DISSATISFIED)),
            sessions=Count("conversation_id", distinct=True, filter=~Q(conversation_id="")),
            positive_sessions=Count(
                "conversation_id",
                distinct=True,
                filter=~Q(conversation_id="") & Q(feedback__outcome__in=POSITIVE_OUTCOMES),
            ),
        )
        .order_by()
    )
    failed = (
        ServingFailure.objects.filter(experiment=experiment)
        .values(part_arm=F("experiment_arm"), part_user=F("end_user_id"))
        .annotate(errors=Count("id"), slow=slow)
        .order_by()
    )
    parts = {"served": (served, SERVED), "failed": (failed, FAILED), "kept": (retained_per_user(experiment), RETAINED)}
    history_freeze(experiment)
    exposures = numbers(*_exposures(experiment), 2 + len(HISTORY))
    exposures = exposures[np.argsort(exposures[:, 0], kind="stable")]  # by id, to place the parts' rows
    users = len(exposures)
    column = {"candidate": exposures[:, 1] == 1}
    column |= {f"history_{n}": exposures[:, 2 + i] for i, n in enumerate(HISTORY)}
    for alias, (rows, names) in parts.items():
        part = numbers(*_part(experiment, rows, names), 1 + len(names))
        at = np.searchsorted(exposures[:, 0], part[:, 0])
        # A user exposed after the exposures were read has no row here: their sums wait for the next snapshot.
        known = at < users
        known[known] = exposures[at[known], 0] == part[known, 0]
        for i, name in enumerate(names):
            column[f"{alias}_{name}"] = np.bincount(at[known], weights=part[known, 1 + i], minlength=users)
    candidate = column.pop("candidate")
    # Covariates of all users together: a user without history gets the pooled value of both arms.
    z = history_covariates(*(column[f"history_{n}"] for n in HISTORY))

    def arm(mask: np.ndarray, p95: float | None) -> ArmData:
        of = {name: values[mask] for name, values in column.items()}
        return ArmData(
            requests=of["served_requests"] + of["failed_errors"],
            shown=of["served_shown"],
            accepted=of["served_accepted"],
            reward_sum=of["served_reward"],
            errors=of["failed_errors"],
            slow_requests=of["served_slow"] + of["failed_slow"],
            positive=of["served_positive"],
            dissatisfied=of["served_dissatisfied"],
            sessions=of["served_sessions"],
            positive_sessions=of["served_positive_sessions"],
            accepted_chars=of["kept_accepted"],
            retained_chars=of["kept_retained"],
            latency_p95_ms=p95,
            covariates=z[mask],
        )

    return arm(~candidate, threshold), arm(candidate, _p95(interactions, experiment, CANDIDATE))
