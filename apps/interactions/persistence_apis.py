"""The persistence-report endpoint: what is left of an accepted completion at checkpoints after the
accept, for retained characters. Shapes for the OpenAPI schema here; validation in
``persistence_validation.py`` (a test compares the two)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.apis import ScopedApi, batch_items, batch_response
from apps.interactions.apis import _batch_result, _one_or_batch, _raise_item_error
from apps.interactions.persistence_validation import MAX_CHECKPOINT_S
from apps.interactions.retention import MAX_REPORTED_TEXT
from apps.interactions.services import persistence_ingest
from apps.tenants.permissions import acts_as_editor, batch_size


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


class PersistenceReportResultOut(serializers.Serializer):
    index = serializers.IntegerField()
    status = serializers.CharField(help_text="recorded, pending or rejected")
    id = serializers.CharField(required=False)
    client_id = serializers.CharField(required=False)
    checkpoint_s = serializers.IntegerField(required=False)
    accepted_chars = serializers.IntegerField(required=False, help_text="characters accepted (recorded reports)")
    retained_chars = serializers.IntegerField(required=False, help_text="of them, still there (recorded reports)")
    error = serializers.DictField(required=False, help_text="{code, message, field} of a rejected item")


class PersistenceReportIngestApi(ScopedApi):
    """What is left of accepted completions at checkpoints after the accept, one or a batch under ``items``."""

    required_scope = "feedback"
    editor_allowed = True  # an editor key: reports on the interactions it served only
    rate_items = staticmethod(batch_size)  # one unit of the rate limit per item

    @extend_schema(
        request=_one_or_batch("PersistenceReportIn", PersistenceReportInSchema),
        responses={
            200: PersistenceReportResultOut,
            202: OpenApiResponse(
                PersistenceReportResultOut, description="kept as pending until the interaction arrives"
            ),
            207: _batch_result("PersistenceReportBatchResult", ("recorded", "pending", "rejected")),
        },
        description="Name the interaction by `interaction_id` or `client_id`, the `checkpoint_s` (seconds after "
        "the accept) and either `text` (what is at the insertion point now, or the document) or `retained_ratio`. "
        "Strop measures `retained_chars` by edit distance against the accepted text (the completion, or its first "
        "`accepted_chars`). One report per interaction and checkpoint: sent twice it is counted once and the "
        "latest `occurred_at` wins; checkpoints may come in any order; a report for a client_id not seen yet is "
        "pending (202) and measured when the interaction arrives, as feedback is.",
    )
    def post(self, request: Request) -> Response:
        items = batch_items(request.data)
        served_by = request.auth.prefix if acts_as_editor(request.user, self.required_scope) else None
        if items is not None:
            results = persistence_ingest(self.tenant, items=items, served_by=served_by)
            return batch_response(results, ("recorded", "pending", "rejected"))
        (result,) = persistence_ingest(self.tenant, items=[request.data], served_by=served_by)
        if result.status == "rejected":
            _raise_item_error(result)
        return Response(result.as_dict(), status=200 if result.status == "recorded" else 202)
