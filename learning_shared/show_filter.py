"""The show filter: withhold a completion the model itself is unsure of.

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

A threshold fitted on a window keeps its recall on that window, not always on code it has not
seen. So the fit checks itself: the window's events are split by *group* (an end user, or a file:
what tells one body of code from another) into a part to fit on and a part to check on
(``CHECK_SHARE`` of the groups, by a hash of their name). The recall the threshold is fitted at is
raised, step by step, until a threshold fitted on the first part at that recall keeps at least
``recall`` of the second part's accepted suggestions; the gate is that recall's threshold on the
whole window. It reports both recalls (``window_recall``, ``check_recall``) and the one it was
fitted at (``fit_recall``). With fewer than ``MIN_ACCEPTED`` accepted suggestions in either part
the check is skipped and the fit is at ``recall``.

Serving shows a withheld suggestion anyway with probability ``explore``; those are recorded, and
weigh ``1 / explore`` in the next fit, so the threshold can also move down (without them the gate
would only ever see suggestions above its own threshold).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_ACCEPTED = 10
# What the gate keeps: a suggestion the user accepted whole. One taken in part or edited counts as
# shown and not accepted, as in the accept rate: counted as taken, the many suggestions whose first
# word or two were right (a third of SmolLM2's shown ones on the training packages) pulled the
# threshold down until it withheld almost nothing (benchmarks/results-log.md).
SHOW_ACCEPTED = ("accepted",)
CHECK_SHARE = 0.3  # of the window's groups, kept out of the fit to check it on
RECALL_STEP = 0.005


def suggestion_score(logprobs: Sequence[float]) -> float:
    """The log-probability of the whole suggestion (0.0 for no tokens)."""
    return float(sum(logprobs))


@dataclass(frozen=True)
class ShowEvent:
    """One shown suggestion of the window: its score, whether it was accepted, and its weight
    (1, or ``1 / explore`` for one the gate withheld and serving showed anyway)."""

    score: float
    accepted: bool
    weight: float = 1.0
    group: str = ""  # what the fit is checked across (an end user, a file); "" for none


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


def recall_of(events: Iterable[ShowEvent], threshold: float) -> float:
    """The weighted share of the accepted ones among ``events`` that ``threshold`` keeps (nan: none)."""
    accepted = [e for e in events if e.accepted]
    total = sum(e.weight for e in accepted)
    return sum(e.weight for e in accepted if e.score >= threshold) / total if total else math.nan


def in_check_part(group: str) -> bool:
    """Whether a group's events are kept out of the fit to check it on (a stable hash of its name)."""
    digest = hashlib.sha256(group.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < CHECK_SHARE


def checked_recall(events: Sequence[ShowEvent], recall: float) -> tuple[float, float | None]:
    """The recall to fit the whole window at, so that a fit on one part of the groups keeps
    ``recall`` of the other's accepted suggestions, and that check's recall (None: no check)."""
    fit = [e for e in events if not in_check_part(e.group)]
    check = [e for e in events if in_check_part(e.group)]
    if min(sum(e.accepted for e in fit), sum(e.accepted for e in check)) < MIN_ACCEPTED:
        return recall, None
    fit_accepted = [(e.score, e.weight) for e in fit if e.accepted]
    target, kept = recall, 0.0
    while True:
        kept = recall_of(check, threshold_for_recall(fit_accepted, target))
        if kept >= recall or target >= 1.0:
            return target, kept
        target = min(1.0, round(target + RECALL_STEP, 6))


def fit_show_threshold(events: Iterable[ShowEvent], *, recall: float) -> dict[str, float | int | None] | None:
    """The gate learned from ``events`` (see the module docstring), or None when too few were accepted.

    Returns ``threshold``, the recall it was fitted at and the check's, and what it would have
    done on its own window: the share of shown suggestions it withholds, the share of accepted
    ones it keeps (``window_recall``), and the accept rate of what is left, all weighted."""
    if not 0.0 < recall <= 1.0:
        raise ValueError(f"recall must be in (0, 1], not {recall!r}")
    events = [e for e in events if math.isfinite(e.score)]
    accepted = [(e.score, e.weight) for e in events if e.accepted]
    if len(accepted) < MIN_ACCEPTED:
        return None
    fit_recall, check_recall = checked_recall(events, recall)
    threshold = threshold_for_recall(accepted, fit_recall)  # with recall 1: the lowest accepted score
    shown = sum(e.weight for e in events)
    kept = [e for e in events if e.score >= threshold]
    kept_weight = sum(e.weight for e in kept)
    kept_accepted = sum(e.weight for e in kept if e.accepted)
    return {
        "threshold": round(threshold, 6),
        "events": len(events),
        "accepted": len(accepted),
        "withheld_share": round(1.0 - kept_weight / shown, 4),
        "fit_recall": fit_recall,
        "check_recall": None if check_recall is None else round(check_recall, 4),
        "window_recall": round(kept_accepted / sum(w for _, w in accepted), 4),
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


def feedback_direction(events: Iterable[ShowEvent]) -> dict[str, float | int] | None:
    """Whether the window's accepts go with the model's confidence, as they do on real code: the
    ROC AUC of the score, accepted against the other shown suggestions (ties count half), and how
    many standard errors it lies from 0.5 under no relation (Mann–Whitney's normal approximation).
    A clean window's AUC is far above 0.5 (0.97 for line completions on the training packages); a
    window whose outcomes were reported the wrong way round has it far below. Unweighted: the
    question is about the reports, not about what the gate would show. None with fewer than
    ``MIN_ACCEPTED`` on either side."""
    from scipy.stats import rankdata  # here: serving imports this module and never needs it

    scored = [(e.score, e.accepted) for e in events if math.isfinite(e.score)]
    accepted = sum(1 for _, a in scored if a)
    others = len(scored) - accepted
    if accepted < MIN_ACCEPTED or others < MIN_ACCEPTED:
        return None
    ranks = rankdata([score for score, _ in scored])  # ties share their average rank
    rank_sum = float(sum(rank for rank, (_, a) in zip(ranks, scored, strict=True) if a))
    auc = (rank_sum - accepted * (accepted + 1) / 2) / (accepted * others)
    se = math.sqrt((accepted + others + 1) / (12 * accepted * others))
    return {"auc": round(auc, 4), "z": round((auc - 0.5) / se, 2), "accepted": accepted, "others": others}
