"""The show gate: withhold a completion the model itself is unsure of.

A served suggestion's *score* is the sum of its sampled tokens' log-probabilities under the model
that wrote it (what vLLM returns with every served completion): the log-probability of the whole
suggestion. On real code it separates what developers accept from what they reject far better than
anything else the platform sees: a suggestion the model wrote with low probability is rarely what
the developer would have typed.

The gate is learned from a tenant's own feedback. Its threshold is the highest score that leaves
at most ``1 − recall`` of the window's *accepted* suggestions (weighted) below it: below it a
suggestion is withheld, the client gets an empty completion. ``recall`` keeps useful suggestions:
the gate is fitted to give up at most that share of what was accepted, and everything it removes
beyond that was rejected. With fewer than ``MIN_ACCEPTED`` accepted suggestions in the window there
is no threshold (no gate).

Serving shows a withheld suggestion anyway with probability ``explore``; those are recorded, and
weigh ``1 / explore`` in the next fit, so the threshold can also move down (without them the gate
would only ever see suggestions above its own threshold).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_ACCEPTED = 10


def suggestion_score(logprobs: Sequence[float]) -> float:
    """The log-probability of the whole suggestion (0.0 for no tokens)."""
    return float(sum(logprobs))


@dataclass(frozen=True)
class GateEvent:
    """One shown suggestion of the window: its score, whether it was accepted, and its weight
    (1, or ``1 / explore`` for one the gate withheld and serving showed anyway)."""

    score: float
    accepted: bool
    weight: float = 1.0


def threshold_for_recall(points: Sequence[tuple[float, float]], recall: float) -> float:
    """The highest value of ``points`` (value, weight) that leaves at most ``1 − recall`` of the
    total weight strictly below it."""
    ordered = sorted(points)
    budget = (1.0 - recall) * sum(w for _, w in ordered) + 1e-9
    below, threshold = 0.0, ordered[0][0]
    for value, weight in ordered:
        if below > budget:
            break
        threshold = value
        below += weight
    return threshold


def fit_show_threshold(events: Iterable[GateEvent], *, recall: float) -> dict[str, float | int] | None:
    """The gate learned from ``events`` (see the module docstring), or None when too few were accepted.

    Returns ``threshold`` and what it would have done on its own window: the share of shown
    suggestions it withholds, the share of accepted ones it keeps, and the accept rate of what is
    left, all weighted."""
    if not 0.0 < recall <= 1.0:
        raise ValueError(f"recall must be in (0, 1], not {recall!r}")
    events = [e for e in events if math.isfinite(e.score)]
    accepted = [(e.score, e.weight) for e in events if e.accepted]
    if len(accepted) < MIN_ACCEPTED:
        return None
    threshold = threshold_for_recall(accepted, recall)  # with recall 1: the lowest accepted score
    shown = sum(e.weight for e in events)
    kept = [e for e in events if e.score >= threshold]
    kept_weight = sum(e.weight for e in kept)
    kept_accepted = sum(e.weight for e in kept if e.accepted)
    return {
        "threshold": round(threshold, 6),
        "events": len(events),
        "accepted": len(accepted),
        "withheld_share": round(1.0 - kept_weight / shown, 4),
        "accepted_kept_share": round(kept_accepted / sum(w for _, w in accepted), 4),
        "accept_rate_before": round(sum(w for _, w in accepted) / shown, 4),
        "accept_rate_after": round(kept_accepted / kept_weight, 4) if kept_weight else 0.0,
    }


def threshold_of(gate: dict[str, Any] | None) -> float | None:
    """A version's stored gate (``AdapterVersion.show_gate``) as its threshold; None: no gate."""
    threshold = (gate or {}).get("threshold")
    return None if threshold is None else float(threshold)


def withholds(score: float, threshold: float | None) -> bool:
    """Whether the gate withholds a suggestion of ``score`` (never without a threshold)."""
    return threshold is not None and score < threshold
