from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.adapters.selectors import adapter_get_for_tenant
from apps.common.apis import ScopedApi
from apps.common.exception_handler import public_text
from apps.common.exceptions import Conflict, ValidationFailed
from apps.training.erasure import training_lineage_retrain
from apps.training.models import REWARD_FIELDS, TrainingPolicy, TrainingRun
from apps.training.overrides import overrides_reference
from apps.training.selectors import training_policy_get, training_run_get_for_tenant, training_run_list
from apps.training.services import (
    eval_set_upload,
    training_policy_update,
    training_schedule,
    training_window_exclude,
)


class TrainingPolicyOut(serializers.ModelSerializer):
    override_limits = serializers.SerializerMethodField(
        help_text="every key trainer_overrides and gate_overrides may hold, with its range"
    )

    def get_override_limits(self, policy: TrainingPolicy) -> dict[str, dict[str, str]]:
        return overrides_reference()

    class Meta:
        model = TrainingPolicy
        fields = [
            "enabled",
            "min_new_events",
            "max_wait_s",
            "heldout_fraction",
            *REWARD_FIELDS.values(),
            "auto_experiment",
            "credit_retained",
            "show_gate",
            "show_gate_recall",
            "show_gate_explore",
            "trainer_overrides",
            "gate_overrides",
            "override_limits",
        ]


class TrainingRunOut(serializers.ModelSerializer):
    adapter = serializers.CharField(source="adapter.name")
    error = serializers.SerializerMethodField(
        help_text="why the run failed, in one line (the traceback is in the operator's log)"
    )
    parent_version = serializers.IntegerField(source="parent_version.number", allow_null=True, default=None)
    output_version = serializers.IntegerField(source="output_version.number", allow_null=True, default=None)
    erased_users = serializers.SerializerMethodField(
        help_text="end users erased while their events were in this run's trained window (their data is gone)"
    )

    def get_erased_users(self, run: TrainingRun) -> int:
        return sum(1 for erasure in run.erasures.all() if erasure.trained_on)

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
            "erased_users",
            "window_excluded_at",
            "window_excluded_by",
        ]

    def get_error(self, obj: TrainingRun) -> str:
        return public_text(obj.error) if obj.error else ""


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


class AdapterRetrainApi(ScopedApi):
    """Retrain the adapter's lineage without the end users erased since its versions learned from them."""

    required_scope = "admin"

    @extend_schema(
        request=None,
        responses={202: TrainingRunOut},
        description="A run from the newest version that learned from no erased end user (or the base), on "
        "every event the newer versions learned and all since; 409 when no version learned from an erased "
        "user, or a run is already going.",
    )
    def post(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        run = training_lineage_retrain(self.tenant, adapter=adapter, actor=self.actor)
        return Response(TrainingRunOut(run).data, status=202)


class TrainingRunDetailApi(ScopedApi):
    required_scope = "admin"

    @extend_schema(responses={200: TrainingRunOut})
    def get(self, request: Request, run_id: str) -> Response:
        return Response(TrainingRunOut(training_run_get_for_tenant(self.tenant, run_id=run_id)).data)


class TrainingRunExcludeWindowApi(ScopedApi):
    """Leave a rejected run's events out of training for good."""

    required_scope = "admin"

    @extend_schema(
        request=None,
        responses={200: TrainingRunOut},
        description="A rejected run does not use up its events: the next run takes the same ones. Where they "
        "are wrong (a client reported outcomes the wrong way round) and cannot be sent again, this leaves them "
        "(its window and its held-out events) out of every later run; 409 for a run that is not rejected. "
        "Doing it again changes nothing.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = training_run_get_for_tenant(self.tenant, run_id=run_id)
        run = training_window_exclude(self.tenant, run=run, actor=self.actor)
        return Response(TrainingRunOut(run).data)
