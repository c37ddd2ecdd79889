"""The one declaration of each ingest input: its fields, their types, bounds and help.

The OpenAPI schema publishes these serializers, and the fast hand-written validators
(``validation.py``, ``persistence_validation.py``) accept exactly their fields: they read the
names from here (``fields_of``), so a field cannot be accepted without being published, or
published without being accepted. The validators check values themselves (per item, with the
error codes of ``apps.common.item_checks``); these classes are never run over a request."""

from __future__ import annotations

from rest_framework import serializers

from apps.common.item_checks import MAX_ID_LEN
from apps.interactions.models import Feedback
from apps.interactions.retention import MAX_REPORTED_TEXT

# The bound of a turn on every path that names one: a logged turn, a session outcome, a served chat
# turn (apps.serving.chat_schemas), so that any turn one of them stores another can name.
MAX_TURN = 100_000
MAX_CHECKPOINT_S = 7 * 24 * 3600  # a week after the accept


def conversation_id_normalize(value: str) -> str:
    """A session's id as every path stores and looks it up (logged turns, served chat turns, session
    outcomes): without surrounding whitespace, so "session-17 " and "session-17" are one session."""
    return value.strip()


def fields_of(declaration: type[serializers.Serializer]) -> frozenset[str]:
    """The field names an input declares (the validator rejects any other)."""
    return frozenset(declaration._declared_fields)


class InteractionInSchema(serializers.Serializer):
    client_id = serializers.CharField(max_length=200, help_text="Your id for this completion; replays are ignored.")
    prompt = serializers.CharField(required=False, help_text="The whole prompt (or send prefix + suffix).")
    prefix = serializers.CharField(required=False)
    suffix = serializers.CharField(required=False)
    completion = serializers.CharField(allow_blank=True, help_text="Empty = nothing was suggested.")
    prompt_token_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=0), required=False, min_length=1
    )  # an empty list is a 400 (apps.common.item_checks): no prompt has zero tokens
    completion_token_ids = serializers.ListField(child=serializers.IntegerField(min_value=0), required=False)
    completion_logprobs = serializers.ListField(
        child=serializers.FloatField(max_value=0), required=False, help_text="One per completion token."
    )
    model = serializers.CharField(required=False, help_text="Model or adapter version that served it.")
    end_user_id = serializers.CharField(required=False)
    opted_in = serializers.BooleanField(required=False)
    served_at = serializers.DateTimeField(required=False)
    latency_ms = serializers.FloatField(required=False, min_value=0)
    metadata = serializers.DictField(required=False)
    messages = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="An agent's turn: the conversation it answered, in OpenAI's message shape (instead of a prompt).",
    )
    tools = serializers.ListField(
        child=serializers.DictField(), required=False, help_text="The tools offered to the model (with messages)."
    )
    tool_calls = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        min_length=1,
        help_text="An agent's turn: the tool calls of its reply, in OpenAI's assistant shape "
        '([{"id", "type": "function", "function": {"name", "arguments"}}]; with messages). `completion` is then '
        "the reply's text, empty if it had none; training learns the calls, never silence.",
    )
    conversation_id = serializers.CharField(
        max_length=MAX_ID_LEN, required=False, help_text="Your id of the agent's session this turn belongs to."
    )
    turn = serializers.IntegerField(
        min_value=0, max_value=MAX_TURN, required=False, help_text="0-based index of this reply in its session."
    )


class FeedbackInSchema(serializers.Serializer):
    interaction_id = serializers.UUIDField(required=False, help_text="Strop's id (the `id` we returned).")
    client_id = serializers.CharField(required=False, help_text="Or your client id; may arrive before the interaction.")
    outcome = serializers.ChoiceField(choices=Feedback.Outcome.choices)
    kept_text = serializers.CharField(
        required=False,
        help_text=(
            "For 'edited': the text the user kept; for 'edit_persisted': the code still in the user's file. "
            "Not on a session outcome (conversation_id)."
        ),
    )
    accepted_chars = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="For 'partial' (and only for it; then required): how many leading characters of the completion "
        "the user took, from 1 to the completion's length - 1 (Unicode code points, as Python's len). An editor's "
        "word-by-word or line-by-line accept; all of it is 'accepted'.",
    )
    occurred_at = serializers.DateTimeField(required=False, help_text="When the user acted; the latest wins.")
    metadata = serializers.DictField(required=False)
    conversation_id = serializers.CharField(
        max_length=MAX_ID_LEN,
        required=False,
        help_text="A session outcome: the agent's session it ends, spread over its turns (with turn and discount).",
    )
    turn = serializers.IntegerField(
        min_value=0, max_value=MAX_TURN, required=False, help_text="With conversation_id: the turn the outcome follows."
    )
    discount = serializers.FloatField(
        min_value=0,
        max_value=1,
        required=False,
        help_text="With conversation_id: 0 gives the outcome to the named turn only, 1 to every earlier turn in full.",
    )


class PersistenceReportInSchema(serializers.Serializer):
    interaction_id = serializers.UUIDField(required=False, help_text="Strop's id (the `id` we returned).")
    client_id = serializers.CharField(required=False, help_text="Or your client id; may arrive before the interaction.")
    checkpoint_s = serializers.IntegerField(
        min_value=1,
        max_value=MAX_CHECKPOINT_S,
        help_text="Seconds after the accept when the text was read (30, 120...).",
    )
    text = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=MAX_REPORTED_TEXT,
        help_text="The text now at the insertion point, or the whole document: Strop finds what is left of the "
        "accepted text in it by edit distance. Empty: all of it is gone.",
    )
    retained_ratio = serializers.FloatField(
        required=False, min_value=0, max_value=1, help_text="Or the share of the accepted text you measured as kept."
    )
    accepted_chars = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="A partial accept: how many leading characters of the completion were taken (default: all of it).",
    )
    occurred_at = serializers.DateTimeField(required=False, help_text="When the text was read; the latest wins.")
    metadata = serializers.DictField(required=False)
