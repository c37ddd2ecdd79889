"""The offline evaluation table of the version page (and of a run's page: a rejected candidate
has no version): a candidate's figures on the adapter's eval set (``learning_shared.offline_eval``),
laid out as rows of figures and columns of models."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from apps.adapters.models import AdapterVersion
from apps.training.models import TrainingRun
from learning_shared.offline_eval import offline_eval_of

# (key, label, what it counts, shown as a share)
_ROWS = (
    (
        "first_line_match",
        "Accepted per request",
        "the first line exactly right, whitespace aside: what a developer taking one line at a time accepts",
        True,
    ),
    ("exact_match", "Whole middle exact", "every line of the middle right", True),
    ("edit_similarity", "Edit similarity", "mean, 1 = identical to the middle", False),
)


@dataclass(frozen=True)
class FigureRow:
    label: str
    hint: str
    percent: bool
    cells: list[tuple[str, dict[str, Any] | None]]
    """(column, ``{"value", "low", "high", "n"}``) per column; None: not recorded."""
    lift: dict[str, Any] | None
    direction: str
    """``better`` / ``worse`` where the lift's interval lies wholly above / below zero, else ``""``."""


@dataclass(frozen=True)
class OfflineEvalTable:
    candidate: str
    """How the page names the candidate (``v2``, or ``the candidate`` where it has no version)."""
    parent: str
    """How it names the parent (``v1`` or ``the base model``)."""
    cases: int
    set_cases: int | None
    """Cases in the eval set when the run read it (None in verdicts that did not record it)."""
    uploaded_at: datetime | None
    columns: list[str]
    rows: list[FigureRow]
    has_intervals: bool
    """False for a verdict stored before intervals were recorded: means only."""
    check: str | None
    accepted: tuple[float, float] | None
    """(parent, candidate) share accepted per request, for the sentence above the table."""


def version_offline_eval(gate: dict[str, Any] | None, version: AdapterVersion) -> OfflineEvalTable | None:
    """The table for ``version`` from its stored gate verdict (its parent from the relation cache)."""
    parent = f"v{version.parent.number}" if version.parent is not None else None
    return offline_eval_table(gate, candidate=f"v{version.number}", parent=parent)


def run_offline_eval(run: TrainingRun) -> OfflineEvalTable | None:
    """The table for a run's candidate, registered as a version or not."""
    candidate = f"v{run.output_version.number}" if run.output_version is not None else "the candidate"
    parent = f"v{run.parent_version.number}" if run.parent_version is not None else None
    return offline_eval_table(run.gate, candidate=candidate, parent=parent)


def offline_eval_table(gate: dict[str, Any] | None, *, candidate: str, parent: str | None) -> OfflineEvalTable | None:
    """The table from a stored gate verdict (``parent`` None: the base model); None when the gate
    decoded no FIM case."""
    record = offline_eval_of(gate)
    if record is None:
        return None
    parent_column = f"Parent {parent}" if parent else "Parent (base model)"
    models = [
        ("base", "Base model"),
        ("parent", parent_column),
        ("candidate", "Candidate" if candidate == "the candidate" else f"Candidate {candidate}"),
    ]
    shown = [(key, label) for key, label in models if record.get(key)]
    rows = []
    for key, label, hint, percent in _ROWS:
        lift = (record.get("lift") or {}).get(key)
        rows.append(
            FigureRow(
                label=label,
                hint=hint,
                percent=percent,
                cells=[(column, record[model].get(key)) for model, column in shown],
                lift=lift,
                direction=_direction(lift),
            )
        )
    eval_set = record.get("eval_set") or {}
    first = [(record.get(model) or {}).get("first_line_match") or {} for model in ("parent", "candidate")]
    values = [figure.get("value") for figure in first]
    return OfflineEvalTable(
        candidate=candidate,
        parent=parent or "the base model",
        cases=int(record.get("cases") or 0),
        set_cases=eval_set.get("cases"),
        uploaded_at=_datetime(eval_set.get("uploaded_at")),
        columns=[label for _, label in shown],
        rows=rows,
        has_intervals=any(cell and cell.get("low") is not None for row in rows for _, cell in row.cells),
        check=record.get("check"),
        accepted=(float(values[0]), float(values[1])) if values[0] is not None and values[1] is not None else None,
    )


def _direction(lift: dict[str, Any] | None) -> str:
    if not lift or lift.get("low") is None or lift.get("high") is None:
        return ""
    if lift["low"] > 0:
        return "better"
    if lift["high"] < 0:
        return "worse"
    return ""


def _datetime(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
