"""One end user's data: read all of it (key scope ``ingest``) or erase it (``admin``:
destructive and irreversible); and purge the weights of a version that learned from erased users."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.adapters.apis import AdapterVersionOut
from apps.adapters.selectors import adapter_get_for_tenant, adapter_version_get_for_tenant
from apps.cohorts.apis import ConsentChangeOut
from apps.cohorts.selectors import end_user_get_for_tenant
from apps.common.apis import ScopedApi
from apps.privacy.purge import adapter_version_purge
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
                        "remains": serializers.ListField(
                            child=serializers.DictField(),
                            help_text="what still holds something learned from the user, and until when: "
                            "each version trained on them or descending from one (kind weights: adapter, "
                            "version, state purgeable / in_use / purged, until), vLLM replicas' caches and "
                            "the operator's backups",
                        ),
                    },
                ),
                description="What was deleted, per table, the versions whose training used this user's events, "
                "the training runs that held them, and what remains until when.",
            )
        }
    )
    def delete(self, request: Request, end_user_id: str) -> Response:
        return Response(end_user_erase(self.tenant, external_id=end_user_id, actor=self.actor).as_dict())


class AdapterVersionPurgeApi(ScopedApi):
    """Delete a version's weights from the adapter store, every stored object version of them; for
    versions that learned from an erased end user (or descend from one), once replaced. Audited."""

    required_scope = "admin"

    @extend_schema(
        request=None,
        responses={200: AdapterVersionOut},
        description="The version is then `purged` (its row stays for the lineage and the audit; it can never "
        "serve again). Idempotent: a purged version answers 200 as it is. 409 `not_trained_on_erased_user` "
        "for a version that learned from no erased end user; 409 `version_in_use` while it is production, in "
        "a draft or running experiment, or the parent of an active training run; 503 when the adapter store "
        "refuses (e.g. object lock keeps the objects).",
    )
    def post(self, request: Request, adapter_name: str, number: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        version = adapter_version_get_for_tenant(self.tenant, adapter=adapter, number=number)
        purged = adapter_version_purge(self.tenant, version=version, actor=self.actor)
        return Response(AdapterVersionOut(purged).data)
