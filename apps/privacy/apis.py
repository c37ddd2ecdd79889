"""One end user's data: read all of it (key scope ``ingest``) or erase it (``admin``:
destructive and irreversible)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.cohorts.apis import ConsentChangeOut
from apps.cohorts.selectors import end_user_get_for_tenant
from apps.common.apis import ScopedApi
from apps.privacy.selectors import end_user_detail
from apps.privacy.services import end_user_erase


class ExposureOut(serializers.Serializer):
    experiment = serializers.IntegerField(source="experiment_id")
    adapter = serializers.CharField(source="experiment.adapter.name")
    status = serializers.CharField(source="experiment.status")
    arm = serializers.CharField()
    first_exposed_at = serializers.DateTimeField()


class RecentInteractionOut(serializers.Serializer):
    id = serializers.UUIDField()
    received_at = serializers.DateTimeField()
    completion = serializers.CharField()
    model = serializers.CharField(source="model_name")
    experiment_arm = serializers.CharField()
    opted_in = serializers.BooleanField(source="end_user_opted_in")
    outcome = serializers.SerializerMethodField()

    def get_outcome(self, obj: Any) -> str | None:
        rows = list(obj.feedback.all())
        return rows[0].outcome if rows else None


class EndUserDetailOut(serializers.Serializer):
    end_user_id = serializers.CharField()
    opted_in = serializers.BooleanField()
    opted_in_changed_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    history = ConsentChangeOut(many=True)
    exposures = ExposureOut(many=True)
    interactions = serializers.IntegerField(help_text="all of this user's interactions")
    recent_interactions = RecentInteractionOut(many=True)


class EndUserDetailApi(ScopedApi):
    """One end user: consent, its history, experiment assignments and recent interactions;
    DELETE erases everything held about them (key scope ``admin``)."""

    required_scope = "ingest"

    def get_required_scope(self) -> str:
        return "admin" if self.request.method == "DELETE" else "ingest"

    @extend_schema(responses={200: EndUserDetailOut})
    def get(self, request: Request, end_user_id: str) -> Response:
        user = end_user_get_for_tenant(self.tenant, external_id=end_user_id)
        detail = end_user_detail(self.tenant, end_user=user)
        state = {
            "end_user_id": user.external_id,
            "opted_in": user.opted_in,
            "opted_in_changed_at": user.opted_in_changed_at,
            "created_at": user.created_at,
        }
        return Response(EndUserDetailOut({**state, **detail}).data)

    @extend_schema(
        responses={
            200: OpenApiResponse(
                inline_serializer(
                    name="EraseReport",
                    fields={
                        "deleted": serializers.DictField(child=serializers.IntegerField()),
                        "versions_trained_on": serializers.ListField(child=serializers.DictField()),
                        "versions_evaluated_on": serializers.ListField(child=serializers.DictField()),
                        "training_runs": serializers.ListField(
                            child=serializers.DictField(),
                            help_text="every run whose window held the user (run, adapter, status, version, "
                            "trained_on, action): an active one is discarded and rerun without them",
                        ),
                        "retrain": serializers.ListField(
                            child=serializers.DictField(child=serializers.CharField()),
                            help_text="adapters whose versions learned from the user, and how to retrain them",
                        ),
                    },
                ),
                description="What was deleted, per table, the versions whose training used this user's events, "
                "and the training runs that held them.",
            )
        }
    )
    def delete(self, request: Request, end_user_id: str) -> Response:
        return Response(end_user_erase(self.tenant, external_id=end_user_id, actor=self.actor).as_dict())
