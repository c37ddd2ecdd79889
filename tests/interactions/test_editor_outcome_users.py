"""An editor outcome lands only on a completion served to the same developer (or to nobody named):
two developers who share a prompt never get each other's accepts."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone

from apps.cohorts.models import EndUser
from apps.interactions.models import Feedback, Interaction
from apps.interactions.served import ServedCompletion, interactions_record_served

pytestmark = pytest.mark.django_db

PROMPT = "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n<|fim_middle|>"
TEXT = "return a + b"


def serve(tenant, *, user: str) -> uuid.UUID:
    """A completion as the serving endpoint records it (Continue sends no completionId with it)."""
    interaction_id = uuid.uuid4()
    interactions_record_served(
        tenant,
        choices=[ServedCompletion(interaction_id, TEXT, [11, 12, 13], [-0.1, -0.2, -0.3], "stop")],
        prompt=PROMPT,
        prefix="",
        suffix="",
        prompt_token_ids=[1, 2, 3],
        model_name="base",
        adapter_id=None,
        adapter_version_id=None,
        experiment_id=None,
        experiment_arm="",
        end_user_id=user,
        end_user_opted_in=False,
        served_at=timezone.now(),
        latency_ms=12.0,
        metadata={},
    )
    return interaction_id


def outcome(completion_id: str, *, accepted: bool = True, **extra) -> dict:
    return {"completionId": completion_id, "prompt": PROMPT, "completion": TEXT, "accepted": accepted, **extra}


def post(client, body: dict, *, user: str | None = None):
    headers = {"HTTP_X_STROP_USER": user} if user is not None else {}
    return client.post("/v1/editor/autocomplete", body, format="json", **headers)


def test_each_developers_outcome_lands_on_their_own_completion_of_a_shared_prompt(client_a):
    served_a = serve(client_a.tenant, user="dev-a")
    served_b = serve(client_a.tenant, user="dev-b")  # the newer one: a match by prompt alone took it

    answer_a = post(client_a, outcome("cont-a", accepted=True), user="dev-a")
    answer_b = post(client_a, outcome("cont-b", accepted=False), user="dev-b")

    assert answer_a.status_code == 200 and answer_a.json()["linked_to_served"] is True
    assert answer_b.status_code == 200 and answer_b.json()["linked_to_served"] is True
    assert Interaction.objects.get(pk=served_a).client_id == "cont-a"
    assert Interaction.objects.get(pk=served_b).client_id == "cont-b"
    assert Feedback.objects.get(interaction_id=served_a).outcome == "accepted"
    assert Feedback.objects.get(interaction_id=served_b).outcome == "rejected"
    assert Interaction.objects.count() == 2


def test_an_outcome_from_another_developer_never_attaches_to_a_completion_served_to_someone_else(client_a):
    served_a = serve(client_a.tenant, user="dev-a")

    answer = post(client_a, outcome("cont-b"), user="dev-b")

    assert answer.status_code == 201 and answer.json()["linked_to_served"] is False
    untouched = Interaction.objects.get(pk=served_a)
    assert untouched.client_id is None and untouched.end_user_id == "dev-a"
    assert not Feedback.objects.filter(interaction_id=served_a).exists()
    logged = Interaction.objects.get(client_id="cont-b")
    assert (logged.source, logged.end_user_id) == (Interaction.Source.EDITOR, "dev-b")
    assert Feedback.objects.get(interaction=logged).outcome == "accepted"


def test_an_outcome_naming_no_developer_does_not_attach_to_a_named_developers_completion(client_a):
    served_a = serve(client_a.tenant, user="dev-a")

    answer = post(client_a, outcome("cont-anon"))

    assert answer.status_code == 201 and answer.json()["linked_to_served"] is False
    assert Interaction.objects.get(pk=served_a).client_id is None
    assert not Feedback.objects.filter(interaction_id=served_a).exists()


def test_a_completion_served_to_nobody_named_still_matches_and_learns_its_developer(client_a):
    served = serve(client_a.tenant, user="")

    answer = post(client_a, outcome("cont-c", uniqueId="dev-c"))

    assert answer.status_code == 200 and answer.json()["linked_to_served"] is True
    linked = Interaction.objects.get(pk=served)
    assert (linked.client_id, linked.end_user_id) == ("cont-c", "dev-c")
    assert Feedback.objects.get(interaction=linked).outcome == "accepted"
    assert EndUser.objects.filter(tenant=client_a.tenant, external_id="dev-c").exists()


def test_the_developers_own_completion_wins_over_one_served_to_nobody_named(client_a):
    own = serve(client_a.tenant, user="dev-a")
    anonymous = serve(client_a.tenant, user="")  # newer

    assert post(client_a, outcome("cont-a"), user="dev-a").json()["linked_to_served"] is True

    assert Interaction.objects.get(pk=own).client_id == "cont-a"
    assert Interaction.objects.get(pk=anonymous).client_id is None


@pytest.mark.parametrize("linked", [True, False])
def test_an_outcome_with_a_nul_in_a_field_name_is_a_400_whether_or_not_it_links(client_a, linked):
    if linked:
        serve(client_a.tenant, user="dev-a")
    answer = post(client_a, {**outcome("cont-nul"), "a\x00b": 1}, user="dev-a")
    assert answer.status_code == 400, answer.content
    assert "NUL" in answer.json()["error"]["message"]
    assert Interaction.objects.filter(client_id="cont-nul").count() == 0
