"""What a request's feedback is worth: the one definition the trainer, the A/B statistics and the
dashboard read.

A reward table maps every feedback outcome to its reward (the adapter's reward policy,
``TrainingPolicy.reward_table()``). A feedback row is worth its outcome's reward times its
``reward_weight`` (1.0, or less for a session outcome spread back over the turns with a discount).

**A request with no feedback is worth 0**, the reward of silence: it adds nothing to a sum. Where a
figure is a mean over *labelled* requests (the dashboard's mean reward) it divides by the labelled
count; where it is a mean over every request (the A/B's reward per request) the unlabelled ones
count in the denominator with their 0.

:func:`reward_value` is the Python form (the trainer's export, the interaction page);
:func:`reward_expression` is the same rule as a SQL expression over interactions LEFT JOIN their
feedback (the dashboard's and the experiments' aggregates). A test checks that the two agree on
every outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from django.db.models import Case, F, FloatField, Value, When
from django.db.models.expressions import Combinable
from django.db.models.functions import Coalesce

from apps.adapters.models import Adapter
from apps.interactions.models import Feedback

# Outcome -> reward, one entry for every ``Feedback.Outcome``.
RewardTable = Mapping[str, float]

UNLABELLED_REWARD = 0.0

# The adapter's reward table. Its reward policy sits above this app (in training, beside the rest of
# the training policy), so training registers the source when it loads (``apps.training.apps``);
# the experiments' statistics read it here and need not import training.
RewardTableSource = Callable[[Adapter], RewardTable]
_source: list[RewardTableSource] = []


def reward_table_source_register(source: RewardTableSource) -> None:
    _source[:] = [source]


def reward_table_for(adapter: Adapter) -> RewardTable:
    """The adapter's reward table, as its reward policy says now."""
    if not _source:
        raise RuntimeError("no reward table source is registered (apps.training is not installed)")
    return _source[0](adapter)


def reward_table_check(table: RewardTable) -> None:
    """Refuse a table that leaves an outcome without a reward (a new outcome must be priced)."""
    missing = set(Feedback.Outcome.values) - set(table)
    if missing:
        raise ValueError(f"the reward table has no reward for: {', '.join(sorted(missing))}")


def reward_value(table: RewardTable, *, outcome: str | None, weight: float = 1.0) -> float:
    """The reward of one request: its feedback's outcome times the weight; 0 without feedback."""
    if outcome is None:
        return UNLABELLED_REWARD
    return float(table[outcome]) * float(weight)


def reward_expression(table: RewardTable, *, feedback: str = "feedback__") -> Combinable:
    """:func:`reward_value` in SQL, over a query whose ``feedback`` relation may be missing (0 then)."""
    reward_table_check(table)
    outcome_reward = Case(
        *(When(**{f"{feedback}outcome": outcome}, then=Value(float(table[outcome]))) for outcome in table),
        default=Value(UNLABELLED_REWARD),
        output_field=FloatField(),
    )
    weight = Coalesce(F(f"{feedback}reward_weight"), Value(1.0), output_field=FloatField())
    return outcome_reward * weight
