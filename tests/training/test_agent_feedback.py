"""Agent feedback: each signal's reward in the adapter's policy, and session outcomes spread over
their turns by the documented rule (docs/agents.md)."""

from __future__ import annotations

import pytest

from apps.interactions.models import Feedback, Interaction
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.dataset import dataset_export, interaction_to_sample
from apps.training.models import TrainingPolicy, TrainingRun

pytestmark = pytest.mark.django_db

AGENT_OUTCOMES = {
    "thumbs_up": 1.0,
    "thumbs_down": -1.0,
    "edit_persisted": 0.75,
    "edit_reverted": -0.5,
    "follow_up_dissatisfied": -0.5,
    "tool_call_failed": -0.5,
}


def export(adapter) -> dict[str, float]:
    policy = TrainingPolicy.objects.get(adapter=adapter)
    policy.heldout_fraction = 0.0
    policy.save()
    run = TrainingRun.objects.create(tenant=adapter.tenant, adapter=adapter, status="exporting")
    return {s.id: s.reward for s in dataset_export(run, policy=policy).train}


def turns(tenant, session: str, numbers, *, user: str = "dev-1") -> dict[int, str]:
    items = [
        {
            "client_id": f"{session}-{n}",
            "messages": [{"role": "user", "content": f"step {n}"}],
            "completion": f"answer {n}",
            "conversation_id": session,
            "turn": n,
            "end_user_id": user,
            "opted_in": True,
        }
        for n in numbers
    ]
    return {n: r.id for n, r in zip(numbers, interactions_ingest(tenant, items=items), strict=True)}


def test_each_agent_signal_has_its_reward_in_the_policy(tenant, tiny_adapter):
    ids = turns(tenant, "s", range(len(AGENT_OUTCOMES)))
    results = feedback_ingest(
        tenant, items=[{"client_id": f"s-{n}", "outcome": o} for n, o in enumerate(AGENT_OUTCOMES)]
    )
    assert {r.status for r in results} == {"recorded"}
    rewards = export(tiny_adapter)
    assert [rewards[ids[n]] for n in range(len(AGENT_OUTCOMES))] == list(AGENT_OUTCOMES.values())


def test_a_tenant_sets_the_reward_of_an_agent_signal(tenant, tiny_adapter, client_a):
    response = client_a.patch(
        "/v1/adapters/tab/training-policy", {"reward_follow_up_dissatisfied": -2.0}, format="json"
    )
    assert response.status_code == 200 and response.json()["reward_follow_up_dissatisfied"] == -2.0
    ids = turns(tenant, "s", [0])
    feedback_ingest(tenant, items=[{"client_id": "s-0", "outcome": "follow_up_dissatisfied"}])
    assert export(tiny_adapter) == {ids[0]: -2.0}


def test_a_session_outcome_spreads_back_over_its_turns_with_the_discount(tenant, tiny_adapter):
    ids = turns(tenant, "s", [0, 1, 2, 3])
    feedback_ingest(
        tenant, items=[{"conversation_id": "s", "turn": 2, "discount": 0.5, "outcome": "thumbs_down"}]
    )
    rewards = export(tiny_adapter)
    assert rewards == {ids[2]: -1.0, ids[1]: -0.5, ids[0]: -0.25}  # turn 3 came after: untouched


def test_a_turns_own_feedback_wins_over_the_session_outcome_either_way_round(tenant, tiny_adapter):
    ids = turns(tenant, "s", [0, 1, 2])
    feedback_ingest(tenant, items=[{"client_id": "s-1", "outcome": "thumbs_up"}])  # before the outcome
    feedback_ingest(tenant, items=[{"conversation_id": "s", "turn": 2, "discount": 1.0, "outcome": "thumbs_down"}])
    feedback_ingest(  # after it, with an older clock: still the turn's own verdict
        tenant, items=[{"client_id": "s-0", "outcome": "edit_persisted", "occurred_at": "2020-01-01T00:00:00Z"}]
    )
    assert export(tiny_adapter) == {ids[0]: 0.75, ids[1]: 1.0, ids[2]: -1.0}
    assert Feedback.objects.get(interaction_id=ids[0]).session_outcome_id is None


def test_turns_that_arrive_after_the_session_outcome_get_it(tenant, tiny_adapter):
    results = feedback_ingest(
        tenant, items=[{"conversation_id": "late", "turn": 1, "discount": 0.5, "outcome": "tool_call_failed"}]
    )
    assert [(r.status, r.conversation_id) for r in results] == [("recorded", "late")]
    ids = turns(tenant, "late", [0, 1, 2])
    assert export(tiny_adapter) == {ids[1]: -0.5, ids[0]: -0.25}


def test_a_newer_session_outcome_replaces_the_older_spread(tenant, tiny_adapter):
    ids = turns(tenant, "s", [0, 1, 2])
    feedback_ingest(
        tenant,
        items=[
            {"conversation_id": "s", "turn": 2, "discount": 1.0, "outcome": "thumbs_down",
             "occurred_at": "2026-11-24T10:00:00Z"},
            {"conversation_id": "s", "turn": 1, "discount": 0.0, "outcome": "thumbs_up",
             "occurred_at": "2026-11-24T10:05:00Z"},
        ],
    )
    assert export(tiny_adapter) == {ids[1]: 1.0}
    older = {"conversation_id": "s", "turn": 2, "outcome": "thumbs_down", "occurred_at": "2026-11-24T09:00:00Z"}
    feedback_ingest(tenant, items=[older])  # late and older: kept as an event, does not win
    assert Feedback.objects.get(interaction_id=ids[1]).outcome == "thumbs_up"


@pytest.mark.parametrize(
    "item, field",
    [
        ({"conversation_id": "s", "outcome": "thumbs_up"}, "turn"),
        ({"conversation_id": "s", "turn": 0, "discount": 1.5, "outcome": "thumbs_up"}, "discount"),
        ({"conversation_id": "s", "turn": 0, "outcome": "edited", "kept_text": "x"}, "outcome"),
        ({"conversation_id": "s", "turn": 0, "outcome": "edit_persisted", "kept_text": "x"}, "kept_text"),
        ({"client_id": "c", "turn": 0, "outcome": "thumbs_up"}, "turn"),
        ({"client_id": "c", "conversation_id": "s", "turn": 0, "outcome": "thumbs_up"}, "interaction_id"),
        ({"client_id": "c", "outcome": "thumbs_sideways"}, "outcome"),
    ],
)
def test_bad_agent_feedback_is_rejected_naming_the_field(tenant, item, field):
    (result,) = feedback_ingest(tenant, items=[item])
    assert result.status == "rejected" and result.error["field"] == field, result


def test_an_erased_users_session_outcomes_go_with_their_turns(tenant, tiny_adapter, client_a):
    turns(tenant, "s", [0, 1], user="leaver")
    feedback_ingest(tenant, items=[{"conversation_id": "s", "turn": 1, "discount": 0.5, "outcome": "thumbs_up"}])
    report = client_a.delete("/v1/users/leaver").json()
    assert report["deleted"]["session_outcomes"] == 1 and report["deleted"]["feedback"] == 2
    assert not Interaction.objects.exists() and not Feedback.objects.exists()


def test_a_logged_conversation_exports_with_the_chat_template(tenant, tiny_adapter):
    from transformers import AutoTokenizer

    from learning_shared.chat import chat_prompt_ids

    (interaction_id,) = turns(tenant, "s", [0]).values()
    interaction = Interaction.objects.get(pk=interaction_id)
    sample = interaction_to_sample(interaction, base=tiny_adapter.base_model, reward=1.0)
    path = tiny_adapter.base_model.path
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert list(sample.prompt_token_ids) == chat_prompt_ids(tokenizer, path, interaction.messages)
    text = tokenizer.decode(list(sample.prompt_token_ids))
    assert text.endswith("<|im_start|>assistant\n") and "step 0" in text
    assert list(sample.completion_token_ids) == tokenizer.encode("answer 0", add_special_tokens=False)


def test_an_agents_turn_exports_the_reward_of_an_empty_answer(tenant, tiny_adapter, add_events):
    turns(tenant, "s", [0])
    feedback_ingest(tenant, items=[{"client_id": "s-0", "outcome": "thumbs_up"}])
    add_events(1, outcome="accepted")  # a completion: its silence is the policy's "not shown"
    policy = TrainingPolicy.objects.get(adapter=tiny_adapter)
    policy.heldout_fraction, policy.reward_follow_up_dissatisfied = 0.0, -0.7
    policy.save()
    run = TrainingRun.objects.create(tenant=tenant, adapter=tiny_adapter, status="exporting")
    samples = dataset_export(run, policy=policy).train
    by_kind = {("chat" if Interaction.objects.get(pk=s.id).messages else "completion"): s for s in samples}
    assert by_kind["chat"].silence_reward == -0.7 and by_kind["completion"].silence_reward is None
