from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.adapters.selectors import adapter_get_for_tenant
from apps.common.apis import ScopedApi
from apps.common.exceptions import Conflict, ValidationFailed
from apps.training.models import REWARD_FIELDS, TrainingPolicy, TrainingRun
from apps.training.selectors import training_policy_get, training_run_get_for_tenant, training_run_list
from apps.training.services import eval_set_upload, training_policy_update, training_schedule


class TrainingPolicyOut(serializers.ModelSerializer):
    class Meta:
        model = TrainingPolicy
        fields = [
            "enabled",
            "min_new_events",
            "max_wait_s",
            "heldout_fraction",
            *REWARD_FIELDS.values(),
            "auto_experiment",
            "show_gate",
            "show_gate_recall",
            "show_gate_explore",
            "trainer_overrides",
            "gate_overrides",
        ]


class TrainingRunOut(serializers.ModelSerializer):
    adapter = serializers.CharField(source="adapter.name")
    parent_version = serializers.IntegerField(source="parent_version.number", allow_null=True, default=None)
    output_version = serializers.IntegerField(source="output_version.number", allow_null=True, default=None)

    class Meta:
        model = TrainingRun
        fields = [
            "id",
            "adapter",
            "status",
            "attempt",
            "trigger",
            "parent_version",
            "output_version",
            "window_size",
            "heldout_size",
            "created_at",
            "started_at",
            "finished_at",
            "heartbeat_at",
            "stage_seconds",
            "trainer_summary",
            "gate",
            "log",
            "error",
        ]


class TrainingPolicyApi(ScopedApi):
    """When the adapter trains, on what reward, with which trainer and gate settings."""

    required_scope = "admin"

    @extend_schema(responses={200: TrainingPolicyOut})
    def get(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        return Response(TrainingPolicyOut(training_policy_get(adapter)).data)

    @extend_schema(request=TrainingPolicyOut(partial=True), responses={200: TrainingPolicyOut})
    def patch(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        if not isinstance(request.data, dict):
            raise ValidationFailed("body: send a JSON object of the fields to change")
        policy = training_policy_update(self.tenant, adapter=adapter, actor=self.actor, changes=request.data)
        return Response(TrainingPolicyOut(policy).data)


class EvalSetApi(ScopedApi):
    """The fill-in-the-middle cases every candidate must not do worse on than its parent."""

    required_scope = "admin"

    @extend_schema(
        request=inline_serializer(
            name="EvalSetIn", fields={"cases": serializers.ListField(child=serializers.DictField())}
        ),
        responses={
            200: inline_serializer(
                name="EvalSetOut",
                fields={"cases": serializers.IntegerField(), "uploaded_at": serializers.DateTimeField()},
            )
        },
    )
    def put(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        data: Any = request.data
        if not isinstance(data, dict) or set(data) != {"cases"}:
            raise ValidationFailed('body: send {"cases": [{"prefix", "suffix", "middle"}, ...]}')
        eval_set = eval_set_upload(self.tenant, adapter=adapter, cases=data["cases"], actor=self.actor)
        return Response({"cases": len(eval_set.cases), "uploaded_at": eval_set.uploaded_at})


class TrainingRunCollectionApi(ScopedApi):
    required_scope = "admin"

    @extend_schema(responses={200: TrainingRunOut(many=True)})
    def get(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        return Response(TrainingRunOut(training_run_list(self.tenant, adapter=adapter)[:100], many=True).data)

    @extend_schema(
        request=None,
        responses={202: TrainingRunOut},
        description="Start a run now, whatever the policy "
        "says; 409 when one is already going or the tenant is at its cap.",
    )
    def post(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        run = training_schedule(adapter, force=True)
        if run is None:
            raise Conflict("a training run is already going for this adapter or tenant", code="run_active")
        return Response(TrainingRunOut(run).data, status=202)


class TrainingRunDetailApi(ScopedApi):
    required_scope = "admin"

    @extend_schema(responses={200: TrainingRunOut})
    def get(self, request: Request, run_id: str) -> Response:
        return Response(TrainingRunOut(training_run_get_for_tenant(self.tenant, run_id=run_id)).data)
