"""End users and their consent. Key scope ``ingest`` reads, opts in or out and imports (the
party that logs a user's interactions is the one that knows their consent). One user's whole
record, and erasing it, are apps.privacy's."""

from __future__ import annotations

import csv
import io
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.cohorts.models import ConsentChange, EndUser
from apps.cohorts.selectors import end_user_counts, end_user_list
from apps.cohorts.services import MAX_IMPORT_ITEMS, end_user_consent_set, end_users_import
from apps.common.apis import ScopedApi, batch_items, paginated, paginated_schema
from apps.common.exceptions import ValidationFailed
from apps.common.parsers import StrictJSONParser
from apps.common.parsing import body_read, query_bool, query_text, reject_unknown_query
from apps.tenants.permissions import batch_size


class EndUserOut(serializers.ModelSerializer):
    end_user_id = serializers.CharField(source="external_id")

    class Meta:
        model = EndUser
        fields = ["end_user_id", "opted_in", "opted_in_changed_at", "created_at"]


class ConsentChangeOut(serializers.ModelSerializer):
    class Meta:
        model = ConsentChange
        fields = ["opted_in", "source", "actor", "changed_at"]


class CsvParser(BaseParser):
    """``text/csv`` with a header row holding ``end_user_id`` and ``opted_in`` (true/false)."""

    media_type = "text/csv"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = body_read(stream)  # past the body limit: a 413, not the rows that fit
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValidationFailed("body: the CSV is not valid UTF-8", code="invalid_utf8") from None
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None or not {"end_user_id", "opted_in"} <= set(reader.fieldnames):
            raise ValidationFailed("body: the CSV needs a header row with end_user_id and opted_in")
        items = []
        for row in reader:
            flag = (row.get("opted_in") or "").strip().lower()
            opted_in: Any = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(
                flag, flag
            )
            items.append({"end_user_id": row.get("end_user_id"), "opted_in": opted_in})
        return {"items": items}


_COUNTS = inline_serializer(
    name="EndUserCounts",
    fields={n: serializers.IntegerField() for n in ("total", "opted_in", "opted_out")},
)


class EndUserListApi(ScopedApi):
    """The tenant's end users, searchable, with counts."""

    required_scope = "ingest"

    @extend_schema(
        operation_id="v1_users_list",
        parameters=[
            OpenApiParameter("search", str, description="part of the end user id"),
            OpenApiParameter("opted_in", bool),
            OpenApiParameter("limit", int),
            OpenApiParameter("offset", int),
        ],
        responses={
            200: inline_serializer(
                name="EndUserPage",
                fields={**paginated_schema("EndUserList", EndUserOut(many=True)).fields, "counts": _COUNTS},
            )
        },
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        reject_unknown_query(params, {"search", "opted_in", "limit", "offset"})
        users = end_user_list(self.tenant, search=query_text(params, "search"), opted_in=query_bool(params, "opted_in"))
        response = paginated(request, users, lambda page: EndUserOut(page, many=True).data)
        response.data["counts"] = end_user_counts(self.tenant)
        return response


class EndUserImportApi(ScopedApi):
    """Set many end users' consent at once: JSON ``{"items": [...]}`` or a CSV upload; 207 per item."""

    required_scope = "ingest"
    rate_items = staticmethod(batch_size)  # one unit of the rate limit per item
    parser_classes = [StrictJSONParser, CsvParser]

    @extend_schema(
        request={
            "application/json": inline_serializer(
                name="EndUserImportIn",
                fields={
                    "items": serializers.ListField(
                        child=inline_serializer(
                            name="EndUserImportItem",
                            fields={"end_user_id": serializers.CharField(), "opted_in": serializers.BooleanField()},
                        ),
                        max_length=MAX_IMPORT_ITEMS,
                    )
                },
            ),
            "text/csv": {"type": "string", "description": "header row: end_user_id,opted_in"},
        },
        responses={
            207: inline_serializer(
                name="EndUserImportResult",
                fields={
                    "opted_in": serializers.IntegerField(),
                    "opted_out": serializers.IntegerField(),
                    "rejected": serializers.IntegerField(),
                    "results": serializers.ListField(child=serializers.DictField()),
                },
            )
        },
    )
    def post(self, request: Request) -> Response:
        items = batch_items(request.data)
        if items is None:
            raise ValidationFailed('body: send {"items": [{"end_user_id", "opted_in"}, ...]} or a CSV file')
        results = end_users_import(self.tenant, items=items, actor=self.actor)
        counts = {status: sum(r.status == status for r in results) for status in ("opted_in", "opted_out", "rejected")}
        return Response({**counts, "results": [r.as_dict() for r in results]}, status=207)


class EndUserConsentApi(ScopedApi):
    """Opt one end user in (``…/opt-in``) or out (``…/opt-out``); created when new."""

    required_scope = "ingest"
    opted_in = True

    @extend_schema(request=None, responses={200: EndUserOut})
    def post(self, request: Request, end_user_id: str) -> Response:
        user = end_user_consent_set(
            self.tenant, external_id=end_user_id, opted_in=self.opted_in, source="api", actor=self.actor
        )
        return Response(EndUserOut(user).data)
