"""A training policy that rewards what stayed (``credit_retained``): an accepted completion with a
persistence report is credited token by token from the latest checkpoint, the tokens still there
earning the accept's reward and the others 0; off by default, and without a usable report the accept
keeps its one reward. On the tiny starter model's tokenizer, through the exporter."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from apps.interactions.models import Interaction
from apps.interactions.retention import MAX_MEASURED
from apps.interactions.services import feedback_ingest, interactions_ingest, persistence_ingest
from apps.training.dataset import dataset_export
from apps.training.models import TrainingRun
from learning_shared.samples import Sample

pytestmark = pytest.mark.django_db

ADD = "def add(a, b):\n    return a + b\n"
SUB = "def sub(a, b):\n    return a - b\n"
COMPLETION = ADD + "\n" + SUB


@pytest.fixture(scope="module")
def tokenizer(tiny_starter_model):
    return AutoTokenizer.from_pretrained(str(tiny_starter_model))


def accepted(tenant, client_id: str, reports: dict[int, dict], completion: str = COMPLETION) -> None:
    item = {"client_id": client_id, "prompt": "# maths.py\n", "completion": completion, "end_user_id": "dev-1"}
    assert interactions_ingest(tenant, items=[{**item, "opted_in": True}])[0].status == "created"
    assert feedback_ingest(tenant, items=[{"client_id": client_id, "outcome": "accepted"}])[0].status == "recorded"
    items = [{"client_id": client_id, "checkpoint_s": c, **fields} for c, fields in reports.items()]
    assert all(r.status == "recorded" for r in persistence_ingest(tenant, items=items))


def export(tiny_adapter, policy) -> dict[str, Sample]:
    run = TrainingRun.objects.create(tenant=tiny_adapter.tenant, adapter=tiny_adapter, status="exporting")
    window = dataset_export(run, policy=policy)
    return {Interaction.objects.get(pk=s.id).client_id: s for s in window.train}


def test_the_tokens_still_there_at_the_latest_checkpoint_earn_the_accepts_reward(
    tenant, tiny_adapter, policy, tokenizer
):
    policy.credit_retained = True
    policy.save()
    # At 30 s everything was there; by 10 min the developer had deleted sub.
    accepted(
        tenant, "kept-add", {600: {"text": "import math\n\n" + ADD + "\nprint(add(1, 2))\n"}, 30: {"text": COMPLETION}}
    )
    accepted(tenant, "deleted", {120: {"text": "# maths.py\n"}})
    accepted(tenant, "ratio", {30: {"retained_ratio": 0.5}})
    samples = export(tiny_adapter, policy)
    ids = samples["kept-add"].completion_token_ids
    credit = samples["kept-add"].token_rewards
    text_of = [tokenizer.decode(ids[: k + 1]) for k in range(len(ids))]
    add_end = next(k for k, text in enumerate(text_of) if len(text) >= len(ADD) - 1)
    assert set(credit[:add_end]) == {policy.reward_accepted}  # add's tokens stayed
    assert set(credit[add_end + 3 :]) == {0.0}  # sub's did not
    assert samples["kept-add"].reward == policy.reward_accepted  # the scalar stays the accept's
    assert samples["deleted"].token_rewards == (0.0,) * len(samples["deleted"].completion_token_ids)
    assert samples["ratio"].token_rewards is None  # a ratio has no text to align tokens with


def test_a_completion_longer_than_was_measured_keeps_the_accepts_one_reward(tenant, tiny_adapter, policy):
    # Only the first MAX_MEASURED characters were aligned: crediting tokens from that stretch would
    # give the rest 0 although it stayed.
    policy.credit_retained = True
    policy.save()
    long = "".join(f"def f{i}(a, b):\n    return a * {i} + b\n" for i in range(MAX_MEASURED // 20))
    assert len(long) > MAX_MEASURED
    accepted(tenant, "long", {30: {"text": long}}, completion=long)
    sample = export(tiny_adapter, policy)["long"]
    assert sample.token_rewards is None and sample.reward == policy.reward_accepted


def test_off_by_default_an_accept_keeps_its_one_reward(tenant, tiny_adapter, policy):
    assert policy.credit_retained is False
    accepted(tenant, "deleted", {120: {"text": ""}})
    assert export(tiny_adapter, policy)["deleted"].token_rewards is None


def test_the_policy_field_is_set_through_the_api(tiny_adapter, client_a):
    url = "/v1/adapters/tab/training-policy"
    assert client_a.get(url).json()["credit_retained"] is False
    response = client_a.patch(url, {"credit_retained": True}, format="json")
    assert response.status_code == 200 and response.json()["credit_retained"] is True
    assert client_a.patch(url, {"credit_retained": "yes"}, format="json").status_code == 400
