"""What the ingest endpoints accept and what the published OpenAPI schema says they accept are the
same fields: a field the validator takes but the schema lacks cannot be sent by a generated client,
and one the schema offers but the validator refuses is a 400 the docs promised would not happen."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator

from apps.interactions.contract import FeedbackInSchema, InteractionInSchema, PersistenceReportInSchema
from apps.interactions.persistence_validation import PERSISTENCE_FIELDS
from apps.interactions.validation import FEEDBACK_FIELDS, INTERACTION_FIELDS


@pytest.fixture(scope="module")
def components() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]


@pytest.mark.parametrize(
    ("serializer", "accepted"),
    [
        (InteractionInSchema, INTERACTION_FIELDS),
        (FeedbackInSchema, FEEDBACK_FIELDS),
        (PersistenceReportInSchema, PERSISTENCE_FIELDS),
    ],
    ids=["interactions", "feedback", "persistence"],
)
def test_the_published_fields_are_the_fields_the_validator_accepts(components, serializer, accepted):
    assert set(serializer().fields) == set(accepted)
    assert set(components[serializer.__name__]["properties"]) == set(accepted)


def test_an_agents_turn_and_a_session_outcome_can_be_sent_by_a_generated_client(components):
    interaction = components["InteractionInSchema"]["properties"]
    assert {"messages", "tools", "conversation_id", "turn"} <= set(interaction)
    feedback = components["FeedbackInSchema"]["properties"]
    assert feedback["discount"]["minimum"] == 0 and feedback["discount"]["maximum"] == 1
    assert feedback["turn"]["minimum"] == 0


def test_the_schema_says_a_prompt_has_at_least_one_token_id_and_a_completion_may_have_none(components):
    interaction = components["InteractionInSchema"]["properties"]
    assert interaction["prompt_token_ids"]["minItems"] == 1  # the validator's 400 for an empty list
    assert "minItems" not in interaction["completion_token_ids"]  # empty: the model stayed silent
