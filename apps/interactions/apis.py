from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.cohorts.erased import Erased
from apps.cohorts.selectors import consent_default
from apps.common.apis import ScopedApi, batch_items, batch_response, paginated, paginated_schema
from apps.common.exceptions import NotFound, ValidationFailed
from apps.common.item_checks import ItemError
from apps.common.parsing import query_text, reject_unknown_query
from apps.interactions.contract import FeedbackInSchema, InteractionInSchema
from apps.interactions.editor import editor_outcome_ingest
from apps.interactions.models import Feedback, Interaction
from apps.interactions.selectors import interaction_get_for_tenant, interaction_list
from apps.interactions.services import ItemResult, feedback_ingest, interactions_ingest
from apps.tenants.permissions import acts_as_editor, batch_size
from apps.tenants.request_consent import end_user_and_consent


def _one_or_batch(name: str, item: type[serializers.Serializer]) -> Any:
    """One item, or ``{"items": [...]}``: the two bodies every ingest endpoint takes."""
    batch = inline_serializer(name=f"{name}Batch", fields={"items": serializers.ListField(child=item())})
    return PolymorphicProxySerializer(component_name=name, serializers=[item, batch], resource_type_field_name=None)


class ItemResultOut(serializers.Serializer):
    index = serializers.IntegerField()
    status = serializers.CharField(help_text="created, duplicate, recorded, pending or rejected")
    id = serializers.CharField(required=False)
    client_id = serializers.CharField(required=False)
    error = serializers.DictField(required=False, help_text="{code, message, field} of a rejected item")


def _item_result() -> Any:
    return ItemResultOut()


def _batch_result(name: str, statuses: tuple[str, ...]) -> Any:
    counts = {status: serializers.IntegerField(help_text=f"items {status}") for status in statuses}
    return inline_serializer(name=name, fields={**counts, "results": serializers.ListField(child=_item_result())})


class FeedbackOutSchema(serializers.ModelSerializer):
    class Meta:
        model = Feedback
        fields = [
            "outcome",
            "kept_text",
            "accepted_chars",
            "occurred_at",
            "received_at",
            "updated_at",
            "events_received",
            "metadata",
        ]


class InteractionOut(serializers.ModelSerializer):
    model = serializers.CharField(source="model_name")
    opted_in = serializers.BooleanField(source="end_user_opted_in")
    # Stored packed (apps.interactions.packed), answered as the lists that were sent.
    prompt_token_ids = serializers.ListField(child=serializers.IntegerField(), allow_null=True, read_only=True)
    completion_token_ids = serializers.ListField(child=serializers.IntegerField(), allow_null=True, read_only=True)
    completion_logprobs = serializers.ListField(child=serializers.FloatField(), allow_null=True, read_only=True)
    feedback = serializers.SerializerMethodField()

    class Meta:
        model = Interaction
        fields = [
            "id",
            "client_id",
            "source",
            "prompt",
            "prefix",
            "suffix",
            "completion",
            "prompt_token_ids",
            "completion_token_ids",
            "completion_logprobs",
            "model",
            "end_user_id",
            "opted_in",
            "served_at",
            "received_at",
            "latency_ms",
            "metadata",
            "messages",
            "tools",
            "conversation_id",
            "turn",
            "feedback",
        ]

    @extend_schema_field(FeedbackOutSchema(allow_null=True))
    def get_feedback(self, obj: Interaction) -> dict[str, Any] | None:
        rows = list(obj.feedback.all())
        return FeedbackOutSchema(rows[0]).data if rows else None


def _raise_item_error(result: ItemResult) -> None:
    error = result.error or {}
    if error.get("code") in {"not_found", "unknown_interaction"}:
        raise NotFound(error["message"], code=error["code"])
    if error.get("code") == "erased":
        raise Erased(error["message"], details=error)
    raise ValidationFailed(error.get("message", "invalid item"), code=error.get("code", "invalid"), details=error)


LabelIngest = Callable[..., list[ItemResult]]


def label_ingest(view: ScopedApi, request: Request, ingest: LabelIngest) -> Response:
    """What the endpoints that label interactions (feedback, persistence reports) share: one item or
    a batch under ``items`` through ``ingest(tenant, items=..., served_by=...)``. A batch is answered
    207 with a verdict per item; one item 200 when recorded, 202 when kept as pending, or its error.
    An editor key's prefix goes as ``served_by``: it labels only what it served."""
    items = batch_items(request.data)
    served_by = view.api_key.prefix if acts_as_editor(view.principal, view.required_scope) else None
    if items is not None:
        results = ingest(view.tenant, items=items, served_by=served_by)
        return batch_response(results, ("recorded", "pending", "rejected"))
    (result,) = ingest(view.tenant, items=[request.data], served_by=served_by)
    if result.status == "rejected":
        _raise_item_error(result)
    return Response(result.as_dict(), status=200 if result.status == "recorded" else 202)


class InteractionCollectionApi(ScopedApi):
    """Log interactions served elsewhere (one, or a batch under ``items``) and list them."""

    required_scope = "ingest"
    rate_items = staticmethod(batch_size)  # one unit of the rate limit per item

    @extend_schema(
        request=_one_or_batch("InteractionIn", InteractionInSchema),
        responses={
            201: InteractionOut,
            200: OpenApiResponse(InteractionOut, description="a replay: the interaction first stored"),
            207: _batch_result("InteractionBatchResult", ("created", "duplicate", "rejected")),
            410: OpenApiResponse(description="its client_id was erased with its end user: not stored again"),
        },
        description='Send one interaction, or `{"items": [...]}` (at most STROP_MAX_BATCH_ITEMS, default 1000) '
        "for a batch answered 207 with a verdict per item: created, duplicate (same client_id seen before) or "
        "rejected (with the error). Rejected items store nothing. One whose client_id an erase removed is "
        "refused (410 `erased`), and so is one served before the hours the tenant's retention has deleted from "
        "(400 `invalid` on `served_at`: it would be deleted at once, and counted twice in the charts if sent again).",
    )
    def post(self, request: Request) -> Response:
        items = batch_items(request.data)
        default = consent_default(self.tenant, api_key=self.api_key)
        if items is not None:
            results = interactions_ingest(self.tenant, items=items, consent_default=default, actor=self.actor)
            return batch_response(results, ("created", "duplicate", "rejected"))
        (result,) = interactions_ingest(self.tenant, items=[request.data], consent_default=default, actor=self.actor)
        if result.status == "rejected":
            _raise_item_error(result)
        interaction = interaction_get_for_tenant(self.tenant, interaction_id=result.id or "")
        return Response(InteractionOut(interaction).data, status=201 if result.status == "created" else 200)

    @extend_schema(
        parameters=[
            OpenApiParameter("end_user_id", str, description="only this end user's interactions"),
            OpenApiParameter("limit", int, description="1 to 500, default 50"),
            OpenApiParameter("offset", int, description="default 0"),
        ],
        responses={200: paginated_schema("PaginatedInteractionList", InteractionOut(many=True))},
        operation_id="v1_interactions_list",
    )
    def get(self, request: Request) -> Response:
        reject_unknown_query(request.query_params, {"end_user_id", "limit", "offset"})
        end_user_id = query_text(request.query_params, "end_user_id")
        queryset = interaction_list(self.tenant, end_user_id=end_user_id).prefetch_related("feedback")
        return paginated(request, queryset, lambda page: InteractionOut(page, many=True).data)


class InteractionDetailApi(ScopedApi):
    required_scope = "ingest"

    @extend_schema(responses={200: InteractionOut})
    def get(self, request: Request, interaction_id: str) -> Response:
        return Response(InteractionOut(interaction_get_for_tenant(self.tenant, interaction_id=interaction_id)).data)


class FeedbackIngestApi(ScopedApi):
    """Accept / reject / not shown / edited / partial, for one interaction or a batch under ``items``."""

    required_scope = "feedback"
    editor_allowed = True  # an editor key: feedback on the interactions it served only
    rate_items = staticmethod(batch_size)  # one unit of the rate limit per item

    @extend_schema(
        request=_one_or_batch("FeedbackIn", FeedbackInSchema),
        responses={
            200: _item_result(),
            202: OpenApiResponse(_item_result(), description="kept as pending until the interaction arrives"),
            207: _batch_result("FeedbackBatchResult", ("recorded", "pending", "rejected")),
            410: OpenApiResponse(description="the interaction or session was erased with its end user: not kept"),
        },
        description="Name the interaction by `interaction_id` (Strop's id) or `client_id` (yours). Feedback sent "
        "twice is counted once: the event with the latest `occurred_at` wins. Feedback for a client_id not seen "
        "yet is kept as pending (202) and attached when the interaction arrives, unless the tenant turned that "
        "off, or an erase removed that interaction (410 `erased`; a session outcome for an erased session with no "
        "turn now, too). An unknown `interaction_id` is 404: Strop issued those ids, so none can arrive later. "
        "`partial` "
        "(the user took the completion's first `accepted_chars` characters) is checked against the completion: "
        "`accepted_chars` outside 1 to its length - 1 is a 400 naming the field.",
    )
    def post(self, request: Request) -> Response:
        return label_ingest(self, request, feedback_ingest)


# Our field names in an error become the outcome's own.
_OUTCOME_NAMES = {
    "client_id": "completionId",
    "model": "modelName",
    "end_user_id": "uniqueId",
    "latency_ms": "time",
    "served_at": "timestamp",
}
_EDITOR_RESULT = inline_serializer(
    name="EditorOutcomeResult",
    fields={
        "status": serializers.CharField(help_text="created, duplicate, linked or ignored"),
        "linked_to_served": serializers.BooleanField(required=False),
        "interaction": serializers.DictField(required=False),
        "feedback": serializers.DictField(required=False, allow_null=True),
        "reason": serializers.CharField(required=False),
    },
)


class EditorOutcomeApi(ScopedApi):
    """Editor plugins' autocomplete outcomes (Continue's data logging posts here): the feedback lands
    on the completion Strop served when it can be matched, else a logged interaction is made."""

    required_scope = "ingest"
    editor_allowed = True  # an editor key: links to, and sends feedback on, what it served only

    @extend_schema(
        request={"application/json": {"type": "object", "additionalProperties": True}},
        responses={
            200: _EDITOR_RESULT,
            201: _EDITOR_RESULT,
            202: OpenApiResponse(_EDITOR_RESULT, description="an event that is not an autocomplete outcome: ignored"),
        },
        description="Continue's event envelope `{name, data, schema (0.1.0 | 0.2.0), level (all | noCode), "
        "profileId}` or a bare AutocompleteOutcome. `completionId` names the outcome; `accepted` records the "
        "feedback. The developer is the `X-Strop-User` header when sent, else `userId`, else `uniqueId`.",
    )
    def post(self, request: Request) -> Response:
        user, flag = end_user_and_consent(request, {}, required=self.required_scope)
        try:
            result = editor_outcome_ingest(
                self.tenant,
                payload=request.data,
                end_user=user,
                opted_in=flag,
                consent_default=consent_default(self.tenant, api_key=self.api_key),
                actor=self.actor,
                served_by=self.api_key.prefix if acts_as_editor(self.principal, self.required_scope) else None,
            )
        except ItemError as exc:
            raise ValidationFailed(exc.message, code=exc.code, details=exc.as_dict()) from None
        stored = result.interaction
        if result.ignored or stored is None:
            return Response({"status": "ignored", "reason": result.ignored}, status=202)
        if stored.status == "rejected":
            error = dict(stored.error or {})
            field = error.get("field", "")
            if field in _OUTCOME_NAMES:
                error["message"] = _OUTCOME_NAMES[field] + error["message"][len(field) :]
                error["field"] = _OUTCOME_NAMES[field]
            raise ValidationFailed(
                error.get("message", "invalid outcome"), code=error.get("code", "invalid"), details=error
            )
        body = {
            "status": stored.status,
            "linked_to_served": result.linked,
            "interaction": stored.as_dict(),
            "feedback": result.feedback.as_dict() if result.feedback else None,
        }
        return Response(body, status=201 if stored.status == "created" else 200)
