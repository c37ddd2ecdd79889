"""One reward: the SQL expression the dashboard and the A/B statistics aggregate agrees with the
Python rule the trainer's export uses, on every outcome and weight, and a request without feedback
is worth 0 in both."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.interactions.models import Feedback, Interaction
from apps.interactions.rewards import reward_expression, reward_table_check, reward_table_for, reward_value
from apps.interactions.services import interactions_ingest
from apps.training.models import TrainingPolicy

pytestmark = pytest.mark.django_db

# A reward per outcome that no other outcome shares, so a swapped or missing branch shows.
TABLE = {outcome: round(0.37 * k - 1.1, 2) for k, outcome in enumerate(Feedback.Outcome.values)}
WEIGHTS = (1.0, 0.5, 0.125)


def _interactions(tenant, n: int) -> list[Interaction]:
    results = interactions_ingest(
        tenant,
        items=[
            {"client_id": f"r-{k:02d}", "prompt": f"x{k} = ", "completion": "1", "end_user_id": "dev"} for k in range(n)
        ],
    )
    return list(Interaction.objects.filter(id__in=[r.id for r in results]).order_by("client_id"))


def test_every_outcome_and_weight_is_worth_the_same_in_sql_and_in_python(tenant):
    cases = [(outcome, weight) for outcome in Feedback.Outcome.values for weight in WEIGHTS]
    rows = _interactions(tenant, len(cases) + 1)
    now = timezone.now()
    expected = {}
    for interaction, (outcome, weight) in zip(rows, cases, strict=False):
        Feedback.objects.create(
            tenant=tenant,
            interaction=interaction,
            outcome=outcome,
            reward_weight=weight,
            occurred_at=now,
            received_at=now,
            updated_at=now,
        )
        expected[interaction.id] = reward_value(TABLE, outcome=outcome, weight=weight)
    unlabelled = rows[-1]
    expected[unlabelled.id] = reward_value(TABLE, outcome=None)

    in_sql = dict(
        Interaction.objects.filter(tenant=tenant).annotate(reward=reward_expression(TABLE)).values_list("id", "reward")
    )

    assert in_sql == pytest.approx(expected)
    assert in_sql[unlabelled.id] == 0.0
    assert len({round(v, 6) for v in expected.values()}) > len(Feedback.Outcome.values)


def test_the_python_rule_multiplies_the_outcomes_reward_by_the_weight():
    assert reward_value(TABLE, outcome="accepted", weight=0.5) == pytest.approx(TABLE["accepted"] / 2)
    assert reward_value(TABLE, outcome=None, weight=0.5) == 0.0


def test_a_table_that_misses_an_outcome_is_refused():
    partial = {k: v for k, v in TABLE.items() if k != "tool_call_failed"}
    with pytest.raises(ValueError, match="tool_call_failed"):
        reward_expression(partial)


def test_a_policy_prices_every_outcome_and_its_feedback_reward_is_the_shared_rule(tenant):
    policy = TrainingPolicy(reward_accepted=0.6, reward_edited=0.2)
    table = policy.reward_table()
    reward_table_check(table)
    feedback = Feedback(tenant=tenant, outcome="edited", reward_weight=0.25)
    assert policy.reward_of(feedback) == pytest.approx(reward_value(table, outcome="edited", weight=0.25)) == 0.05


def test_the_experiments_read_the_reward_table_the_training_policy_holds_now(tenant, tiny_starter_model):
    """``reward_table_for`` (what the A/B statistics price feedback with) follows the policy's edits."""
    from apps.adapters.services import adapter_create, base_model_register
    from apps.training.services import training_policy_update

    adapter = adapter_create(tenant, name="tab", base_model=base_model_register(name="base", path=tiny_starter_model))
    assert reward_table_for(adapter) == TrainingPolicy().reward_table()
    training_policy_update(tenant, adapter=adapter, actor="test", changes={"reward_rejected": -0.9})
    assert reward_table_for(adapter)["rejected"] == -0.9
    assert reward_table_for(adapter) == TrainingPolicy.objects.get(adapter=adapter).reward_table()
