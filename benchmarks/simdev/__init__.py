"""Simulated developers on real code: tasks, acceptance rules, and sessions through the SDK.

Used by the demo (``demo/loop.py``) and the benchmarks. Scripts in ``benchmarks/``
import it as ``simdev``; the tests as ``benchmarks.simdev``.
"""

from .developers import (
    BLOCK_MIN_SIMILARITY,
    NEARLY_RIGHT,
    POPULATIONS,
    REWARDS,
    Decision,
    Outcome,
    block_accepts,
    decide,
    edit_distance,
    edit_similarity,
    is_shown,
    line_accepts,
    normalise_line,
    respond,
    words_taken,
)
from .session import FeedbackRefused, Request, SessionResult, Summary, deliver_feedback, run_session, summarise
from .stats import Estimate, mean_interval, wilson
from .tasks import (
    EVAL_PACKAGES,
    TRAIN_PACKAGES,
    Context,
    Population,
    Split,
    Task,
    iter_tasks,
    load_tasks,
    read_jsonl,
    write_jsonl,
)
from .traits import PROPENSITY_BETA, propensity, with_propensity

__all__ = [
    "PROPENSITY_BETA",
    "propensity",
    "with_propensity",
    "BLOCK_MIN_SIMILARITY",
    "EVAL_PACKAGES",
    "NEARLY_RIGHT",
    "POPULATIONS",
    "REWARDS",
    "TRAIN_PACKAGES",
    "Context",
    "Decision",
    "Estimate",
    "FeedbackRefused",
    "Outcome",
    "Population",
    "Request",
    "SessionResult",
    "Split",
    "Summary",
    "Task",
    "block_accepts",
    "decide",
    "deliver_feedback",
    "edit_distance",
    "edit_similarity",
    "is_shown",
    "iter_tasks",
    "line_accepts",
    "load_tasks",
    "mean_interval",
    "normalise_line",
    "read_jsonl",
    "respond",
    "run_session",
    "summarise",
    "wilson",
    "words_taken",
    "write_jsonl",
]
