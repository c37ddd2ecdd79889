"""A candidate's offline evaluation on the tenant's FIM eval set: the figures the gate records
(``fim_figures``) and the one reader of a stored verdict that the API and the dashboard share.

Per model (the candidate, its parent, and the base model where the parent is an adapter), over
the same cases:

- ``first_line_match``: the share of cases whose completion has the middle's first line,
  whitespace aside: what a developer taking one line at a time accepts ("accepted per request",
  offline). Wilson 95 % interval.
- ``exact_match``: the share whose whole middle is right. Wilson 95 % interval.
- ``edit_similarity``: the mean edit similarity to the whole middle. Student's t 95 % interval.

``lift`` is candidate − parent, paired by case: the mean of the per-case differences with its
Student's t 95 % interval, kept within [−1, 1] (for the shares, in share units: 0.05 is 5 points);
under 5 cases a mean has no interval (``intervals.MIN_MEAN_INTERVAL_N``).

Each figure is ``{"value", "low", "high", "n"}`` (``intervals.Estimate``). Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from learning_shared.fim_metrics import CaseScore
from learning_shared.intervals import mean_interval, wilson

FIGURES: tuple[str, ...] = ("first_line_match", "exact_match", "edit_similarity")
MODELS: tuple[str, ...] = ("base", "parent", "candidate")


def _per_case(scores: Sequence[CaseScore], figure: str) -> list[float]:
    attribute = {"first_line_match": "first_line", "exact_match": "exact", "edit_similarity": "similarity"}[figure]
    return [float(getattr(score, attribute)) for score in scores]


def model_figures(scores: Sequence[CaseScore]) -> dict[str, dict[str, Any]]:
    """One model's three figures over its cases."""
    n = len(scores)
    return {
        "first_line_match": wilson(sum(s.first_line for s in scores), n).as_dict(),
        "exact_match": wilson(sum(s.exact for s in scores), n).as_dict(),
        "edit_similarity": mean_interval(_per_case(scores, "edit_similarity")).as_dict(),
    }


def paired_lift(candidate: Sequence[CaseScore], parent: Sequence[CaseScore]) -> dict[str, dict[str, Any]]:
    """Candidate − parent on each figure, case by case (the same cases, in the same order)."""
    if len(candidate) != len(parent):
        raise ValueError(f"paired lift needs the same cases: {len(candidate)} vs {len(parent)}")
    lift = {}
    for figure in FIGURES:
        differences = [c - p for c, p in zip(_per_case(candidate, figure), _per_case(parent, figure), strict=True)]
        estimate = mean_interval(differences)
        if estimate.low is not None and estimate.high is not None:  # a difference of two figures in [0, 1]
            estimate = replace(estimate, low=max(-1.0, estimate.low), high=min(1.0, estimate.high))
        lift[figure] = estimate.as_dict()
    return lift


def fim_figures(scores: Mapping[str, Sequence[CaseScore]]) -> dict[str, Any]:
    """The record the gate stores from each model's per-case scores (``candidate`` and
    ``parent`` required, ``base`` optional)."""
    record: dict[str, Any] = {"cases": len(scores["candidate"])}
    for model in MODELS:
        record[model] = model_figures(scores[model]) if model in scores else None
    record["lift"] = paired_lift(scores["candidate"], scores["parent"])
    return record


def _means_only(means: Mapping[str, Any], n: int) -> dict[str, Any]:
    return {
        figure: {"value": means[figure], "low": None, "high": None, "n": n} if figure in means else None
        for figure in FIGURES
    }


def offline_eval_of(gate: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The offline evaluation in a stored gate verdict, or None when the gate decoded no FIM case.

    ``{"cases", "eval_set", "check", "rule", "base", "parent", "candidate", "lift"}``; ``base`` is
    None where the parent is the base model; ``rule`` is how the check decided (``paired``: the
    lift's edit-similarity interval; ``margin``: under 5 cases), None in verdicts stored before it.
    A verdict stored before the figures existed holds means only: it reads back with those values,
    no intervals, and no first-line figure.
    """
    if not gate:
        return None
    figures = gate.get("fim_figures")
    if isinstance(figures, Mapping):
        record = {key: figures.get(key) for key in ("cases", *MODELS, "lift")}
    elif isinstance(gate.get("fim_candidate"), Mapping) and isinstance(gate.get("fim_parent"), Mapping):
        n = int(gate.get("fim_count") or 0)
        candidate, parent = gate["fim_candidate"], gate["fim_parent"]
        record = {
            "cases": n,
            "base": None,
            "parent": _means_only(parent, n),
            "candidate": _means_only(candidate, n),
            "lift": _means_only(
                {f: candidate[f] - parent[f] for f in FIGURES if _number(candidate.get(f)) and _number(parent.get(f))},
                n,
            ),
        }
    else:
        return None
    record["eval_set"] = gate.get("fim_eval_set")
    record["check"] = gate.get("fim_check")
    record["rule"] = gate.get("fim_rule")
    return record


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
