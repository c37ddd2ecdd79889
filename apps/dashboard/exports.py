"""CSV exports: a tenant's interactions with their feedback, and an experiment's results.

A cell a spreadsheet would read as a formula (it starts with ``=``, ``+``, ``-``, ``@``, a tab or
a carriage return) is prefixed with an apostrophe, so an end user's text never runs in the
tenant's spreadsheet (OWASP's advice on CSV injection). Numbers are written as numbers.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from apps.dashboard.experiment_results import ExperimentResults
from apps.interactions.models import Interaction

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

INTERACTION_COLUMNS = (
    ("id", "id"),
    ("client_id", "client_id"),
    ("source", "source"),
    ("served_at", "served_at"),
    ("received_at", "received_at"),
    ("model", "model_name"),
    ("version", "adapter_version__number"),
    ("end_user_id", "end_user_id"),
    ("opted_in", "end_user_opted_in"),
    ("experiment", "experiment_id"),
    ("experiment_arm", "experiment_arm"),
    ("conversation_id", "conversation_id"),
    ("turn", "turn"),
    ("prompt", "prompt"),
    ("prefix", "prefix"),
    ("suffix", "suffix"),
    ("completion", "completion"),
    ("latency_ms", "latency_ms"),
    ("outcome", "feedback__outcome"),
    ("kept_text", "feedback__kept_text"),
    ("feedback_at", "feedback__occurred_at"),
)


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: text that could start a formula is neutralised; None is empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class _Line:
    """A file-like that hands back what csv.writer wrote, one line at a time."""

    def write(self, value: str) -> str:
        return value


def csv_lines(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> Iterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow(list(header))
    for row in rows:
        yield writer.writerow([csv_cell(v) for v in row])


def interactions_csv(interactions: QuerySet[Interaction]) -> Iterator[str]:
    """Every interaction of the query with its feedback, streamed (the database is read in chunks)."""
    fields = [field for _, field in INTERACTION_COLUMNS]
    rows = interactions.order_by("-served_at", "-id").values_list(*fields).iterator(chunk_size=2000)
    return csv_lines([name for name, _ in INTERACTION_COLUMNS], rows)


def _adjusted_cells(adjusted: dict[str, Any] | None) -> tuple[Any, ...]:
    """The lift adjusted for users' history, as the page shows it; blanks without one."""
    if adjusted is None:
        return (None,) * 5
    interval = adjusted.get("interval") or [None, None]
    return (
        adjusted.get("abs_lift"), interval[0], interval[1], adjusted.get("p_always_valid"),
        adjusted.get("variance_reduction"),
    )


def experiment_results_csv(results: ExperimentResults) -> Iterator[str]:
    """One row per metric as the experiment page shows it, with the decision and users per arm."""
    experiment = results.experiment
    header = (
        "experiment", "adapter", "metric", "role", "control", "candidate", "absolute_lift", "relative_lift",
        "interval_low", "interval_high", "p_always_valid", "decision", "control_users", "candidate_users",
        "computed_at", "adjusted_lift", "adjusted_interval_low", "adjusted_interval_high",
        "adjusted_p_always_valid", "variance_reduction",
    )
    users = {arm: (results.arms.get(arm) or {}).get("users") for arm in ("control", "candidate")}
    computed = results.snapshot.computed_at if results.snapshot is not None else None
    rows = [
        (
            experiment.pk, experiment.adapter.name, row.name, row.role, row.control, row.candidate, row.abs_lift,
            row.rel_lift, row.interval[0] if row.interval else None, row.interval[1] if row.interval else None,
            row.p_always_valid, results.decision.get("action", ""), users["control"], users["candidate"], computed,
            *_adjusted_cells(row.adjusted),
        )
        for row in results.metrics
    ]
    return csv_lines(header, rows)
