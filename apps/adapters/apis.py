from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.selectors import (
    adapter_get_for_tenant,
    adapter_list,
    adapter_version_get_for_tenant,
    adapter_version_list,
)
from apps.common.apis import ScopedApi
from apps.common.exception_handler import public_text
from learning_shared.offline_eval import offline_eval_of


class EstimateOut(serializers.Serializer):
    value = serializers.FloatField(allow_null=True)
    low = serializers.FloatField(allow_null=True, help_text="95 % interval; null where there are too few cases")
    high = serializers.FloatField(allow_null=True)
    n = serializers.IntegerField(help_text="cases")


class FiguresOut(serializers.Serializer):
    first_line_match = EstimateOut(
        allow_null=True, help_text="share of cases whose first line is right, whitespace aside (Wilson interval)"
    )
    exact_match = EstimateOut(allow_null=True, help_text="share whose whole middle is right (Wilson interval)")
    edit_similarity = EstimateOut(allow_null=True, help_text="mean edit similarity to the middle (normal interval)")


class EvalSetRefOut(serializers.Serializer):
    cases = serializers.IntegerField(help_text="cases in the eval set when the run read it")
    uploaded_at = serializers.DateTimeField()


class OfflineEvalOut(serializers.Serializer):
    cases = serializers.IntegerField(help_text="cases decoded (the first max_fim_samples of the set)")
    eval_set = EvalSetRefOut(allow_null=True)
    check = serializers.CharField(allow_null=True, help_text="the gate's FIM check: passed, failed or skipped")
    rule = serializers.CharField(
        allow_null=True,
        help_text="how the check decided: paired (fails when the edit-similarity lift's interval lies below "
        "-fim_margin) or margin (under 5 cases: the mean difference against -fim_margin); null in older verdicts",
    )
    base = FiguresOut(allow_null=True, help_text="the base model; null where the parent is the base model")
    parent = FiguresOut(allow_null=True)
    candidate = FiguresOut(allow_null=True)
    lift = FiguresOut(allow_null=True, help_text="candidate − parent, paired by case")


class AdapterVersionOut(serializers.ModelSerializer):
    # A declared field named as a field attribute is never shadowed by it (DRF's _declared_fields).
    parent = serializers.IntegerField(source="parent.number", allow_null=True, default=None)  # type: ignore[assignment]
    status_message = serializers.SerializerMethodField(help_text="why the version failed to load, if it did")
    offline_eval = serializers.SerializerMethodField(
        help_text="the gate's evaluation of this version on the adapter's eval set; null without one"
    )

    @extend_schema_field(OfflineEvalOut(allow_null=True))
    def get_offline_eval(self, version: AdapterVersion) -> dict[str, Any] | None:
        return offline_eval_of((version.metrics or {}).get("gate"))

    def get_status_message(self, version: AdapterVersion) -> str:
        # Rows written before messages were cleaned may hold a replica's address or a path.
        return public_text(version.status_message) if version.status_message else ""

    class Meta:
        model = AdapterVersion
        fields = [
            "number",
            "vllm_name",
            "status",
            "status_message",
            "parent",
            "lora_rank",
            "metrics",
            "offline_eval",
            "show_gate",
            "created_at",
            "loaded_at",
            "purged_at",
        ]


class AdapterOut(serializers.ModelSerializer):
    base_model = serializers.CharField(source="base_model.name")
    production_version = serializers.IntegerField(source="production_version.number", allow_null=True, default=None)

    class Meta:
        model = Adapter
        fields = ["name", "base_model", "is_default", "production_version", "created_at"]


class AdapterListApi(ScopedApi):
    """The tenant's adapters and which version each serves in production."""

    required_scope = "admin"

    @extend_schema(responses={200: AdapterOut(many=True)})
    def get(self, request: Request) -> Response:
        return Response(AdapterOut(adapter_list(self.tenant), many=True).data)


class AdapterVersionListApi(ScopedApi):
    required_scope = "admin"

    @extend_schema(responses={200: AdapterVersionOut(many=True)})
    def get(self, request: Request, adapter_name: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        versions = adapter_version_list(self.tenant, adapter=adapter).select_related("parent")
        return Response(AdapterVersionOut(versions, many=True).data)


class AdapterVersionDetailApi(ScopedApi):
    """One version, with its gate numbers and its offline evaluation."""

    required_scope = "admin"

    @extend_schema(responses={200: AdapterVersionOut})
    def get(self, request: Request, adapter_name: str, number: str) -> Response:
        adapter = adapter_get_for_tenant(self.tenant, name=adapter_name)
        version = adapter_version_get_for_tenant(self.tenant, adapter=adapter, number=number)
        return Response(AdapterVersionOut(version).data)
