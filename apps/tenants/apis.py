from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.apis import ScopedApi
from apps.common.parsing import StrictSerializer
from apps.tenants.models import RETENTION_DAYS_MOST, ApiKey, AuditEvent, Tenant
from apps.tenants.selectors import api_key_get_for_tenant, api_key_list, audit_event_list
from apps.tenants.services import ALL_SCOPES, api_key_create, api_key_revoke, tenant_settings_update


class TenantOut(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = [
            "slug",
            "name",
            "rate_limit_per_minute",
            "accept_pending_feedback",
            "default_opt_in",
            "experiment_auto_promote",
            "experiment_auto_rollback",
            "retention_days",
            "created_at",
        ]


class TenantSettingsIn(StrictSerializer):
    default_opt_in = serializers.BooleanField(required=False)
    experiment_auto_promote = serializers.BooleanField(required=False)
    experiment_auto_rollback = serializers.BooleanField(required=False)
    accept_pending_feedback = serializers.BooleanField(required=False)
    retention_days = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=RETENTION_DAYS_MOST,
        help_text="delete interactions and feedback older than this many days (null: the operator's maximum, "
        "STROP_RETENTION_MAX_DAYS, or forever); at most that maximum. Rollups (the charts) are kept",
    )


class ApiKeyOut(serializers.ModelSerializer):
    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "default_opt_in", "created_at", "last_used_at", "revoked_at"]


class ApiKeyCreatedOut(ApiKeyOut):
    key = serializers.CharField(help_text="The secret. Shown once: Strop keeps only its hash.")

    class Meta(ApiKeyOut.Meta):
        fields = [*ApiKeyOut.Meta.fields, "key"]


class ApiKeyCreateIn(StrictSerializer):
    name = serializers.CharField(max_length=200)
    scopes = serializers.ListField(child=serializers.CharField(), allow_empty=False, help_text=", ".join(ALL_SCOPES))
    default_opt_in = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="consent of end users first seen through this key without a flag (editor plugins send none); "
        "null: the tenant's default",
    )


class AuditEventOut(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "actor", "action", "target_type", "target_id", "data", "created_at"]


class TenantMeApi(ScopedApi):
    """The tenant this key belongs to, and the key's scopes; PATCH changes the tenant's settings
    (key scope ``admin``)."""

    required_scope = "any"

    def get_required_scope(self) -> str:
        return "admin" if self.request.method == "PATCH" else "any"

    @extend_schema(
        responses={200: inline_serializer(name="TenantMe", fields={**TenantOut().fields, "key": ApiKeyOut()})}
    )
    def get(self, request: Request) -> Response:
        return Response({**TenantOut(self.tenant).data, "key": ApiKeyOut(self.api_key).data})

    @extend_schema(request=TenantSettingsIn, responses={200: TenantOut})
    def patch(self, request: Request) -> Response:
        data = TenantSettingsIn(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = tenant_settings_update(self.tenant, actor=self.actor, changes=dict(data.validated_data))
        return Response(TenantOut(tenant).data)


class ApiKeyCollectionApi(ScopedApi):
    required_scope = "admin"

    @extend_schema(responses={200: ApiKeyOut(many=True)})
    def get(self, request: Request) -> Response:
        return Response(ApiKeyOut(api_key_list(self.tenant), many=True).data)

    @extend_schema(request=ApiKeyCreateIn, responses={201: ApiKeyCreatedOut})
    def post(self, request: Request) -> Response:
        data = ApiKeyCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        issued = api_key_create(self.tenant, actor=self.actor, **data.validated_data)
        return Response({**ApiKeyOut(issued.api_key).data, "key": issued.raw_key}, status=201)


class ApiKeyDetailApi(ScopedApi):
    required_scope = "admin"

    @extend_schema(responses={200: ApiKeyOut})
    def get(self, request: Request, key_id: str) -> Response:
        return Response(ApiKeyOut(api_key_get_for_tenant(self.tenant, key_id=key_id)).data)

    @extend_schema(responses={200: ApiKeyOut}, description="Revoke the key; it stops working at once.")
    def delete(self, request: Request, key_id: str) -> Response:
        api_key = api_key_get_for_tenant(self.tenant, key_id=key_id)
        return Response(ApiKeyOut(api_key_revoke(self.tenant, api_key=api_key, actor=self.actor)).data)


class AuditEventListApi(ScopedApi):
    required_scope = "admin"

    @extend_schema(responses={200: AuditEventOut(many=True)})
    def get(self, request: Request) -> Response:
        return Response(AuditEventOut(audit_event_list(self.tenant)[:200], many=True).data)
