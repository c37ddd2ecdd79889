"""The assignment endpoint: which version an end user should get, for tenants serving elsewhere."""

from __future__ import annotations

import dataclasses

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.apis import ScopedApi
from apps.common.exceptions import ValidationFailed
from apps.common.parsing import end_user_id_check, query_bool, query_text, reject_unknown_query
from apps.serving.assignment import serving_assignment


class AssignmentApi(ScopedApi):
    """For tenants that serve elsewhere: which version this end user should get now. Opted-in users
    of a running experiment get their arm (and the exposure is recorded); everyone else production.

    It records the end user's consent (``opted_in``, or the default for a user seen for the first
    time), so the key needs a scope that may write consent: ``serve`` (as a served completion
    would) or ``ingest`` (as logging does)."""

    required_scope = "any"
    consent_scopes = frozenset({"serve", "ingest"})

    @extend_schema(
        parameters=[
            OpenApiParameter("user", str, required=True, description="the end user's id"),
            OpenApiParameter("opted_in", bool, description="their consent now, if you know it"),
        ],
        responses={
            200: inline_serializer(
                name="Assignment",
                fields={
                    "adapter": serializers.CharField(),
                    "user": serializers.CharField(),
                    "opted_in": serializers.BooleanField(),
                    "experiment": serializers.IntegerField(allow_null=True),
                    "arm": serializers.CharField(allow_null=True),
                    "version": serializers.IntegerField(allow_null=True),
                    "model": serializers.CharField(help_text="the vLLM name of the version to serve"),
                },
            )
        },
    )
    def get(self, request: Request, adapter_name: str) -> Response:
        if not self.consent_scopes & self.principal.scopes:
            raise PermissionDenied("this API key lacks the 'serve' or 'ingest' scope (assignment records consent)")
        reject_unknown_query(request.query_params, {"user", "opted_in"})
        user = query_text(request.query_params, "user") or ""
        if not user:
            raise ValidationFailed("user: required, the end user's id")
        end_user_id_check(user, field_name="user")
        flag = query_bool(request.query_params, "opted_in")
        found = serving_assignment(
            self.tenant, adapter_name=adapter_name, user=user, flag=flag, api_key=self.api_key, actor=self.actor
        )
        return Response(dataclasses.asdict(found))
