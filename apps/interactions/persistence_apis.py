"""The persistence-report endpoints: what is left of an accepted completion at checkpoints after the
accept, for retained characters (the batch path); and, read side, an interaction's measured reports.
The batch path's shape is declared in ``contract.py``; validation in ``persistence_validation.py``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.apis import ScopedApi
from apps.interactions.apis import _batch_result, _one_or_batch, label_ingest
from apps.interactions.contract import PersistenceReportInSchema
from apps.interactions.models import PersistenceReport
from apps.interactions.selectors import interaction_get_for_tenant, persistence_for_interaction
from apps.interactions.services import persistence_ingest
from apps.tenants.permissions import batch_size


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
            410: OpenApiResponse(description="the interaction was erased with its end user: the report is not kept"),
        },
        description="Name the interaction by `interaction_id` or `client_id`, the `checkpoint_s` (seconds after "
        "the accept) and either `text` (what is at the insertion point now, or the document) or `retained_ratio`. "
        "Strop measures `retained_chars` by edit distance against the accepted text (the completion, or its first "
        "`accepted_chars`). One report per interaction and checkpoint: sent twice it is counted once and the "
        "latest `occurred_at` wins; checkpoints may come in any order; a report for a client_id not seen yet is "
        "pending (202) and measured when the interaction arrives, as feedback is; one for an interaction an erase "
        "removed is refused (410 `erased`).",
    )
    def post(self, request: Request) -> Response:
        return label_ingest(self, request, persistence_ingest)


class PersistenceCheckpointOut(serializers.ModelSerializer):
    retained_share = serializers.SerializerMethodField(help_text="retained ÷ accepted characters (null: none accepted)")

    class Meta:
        model = PersistenceReport
        fields = [
            "checkpoint_s",
            "accepted_chars",
            "retained_chars",
            "retained_share",
            "reported_ratio",
            "occurred_at",
            "updated_at",
            "events_received",
        ]

    def get_retained_share(self, report: PersistenceReport) -> float | None:
        if not report.accepted_chars or report.retained_chars is None:
            return None
        return report.retained_chars / report.accepted_chars


class InteractionPersistenceOut(serializers.Serializer):
    interaction_id = serializers.UUIDField()
    accepted_chars = serializers.IntegerField(allow_null=True, help_text="at the latest checkpoint; null: no report")
    retained_chars = serializers.IntegerField(allow_null=True, help_text="at the latest checkpoint; null: no report")
    latest_checkpoint_s = serializers.IntegerField(allow_null=True)
    reports = PersistenceCheckpointOut(many=True, help_text="one per checkpoint, earliest first")


class InteractionPersistenceApi(ScopedApi):
    """What was left of an interaction's accepted completion at each checkpoint reported so far."""

    required_scope = "ingest"  # as reading the interaction itself

    @extend_schema(responses={200: InteractionPersistenceOut})
    def get(self, request: Request, interaction_id: str) -> Response:
        interaction = interaction_get_for_tenant(self.tenant, interaction_id=interaction_id)
        reports = persistence_for_interaction(self.tenant, interaction=interaction)
        latest = reports[-1] if reports else None
        body = {
            "interaction_id": interaction.pk,
            "accepted_chars": latest.accepted_chars if latest else None,
            "retained_chars": latest.retained_chars if latest else None,
            "latest_checkpoint_s": latest.checkpoint_s if latest else None,
            "reports": reports,
        }
        return Response(InteractionPersistenceOut(body).data)
