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
from apps.cohorts.selectors import (
    COUNT_CAP,
    SEARCH_MIN_CHARS,
    capped_count,
    end_user_counts_capped,
    end_user_list,
    end_user_page,
)
from apps.cohorts.services import MAX_IMPORT_ITEMS, end_user_consent_set, end_users_import
from apps.common.apis import ScopedApi, batch_items, keyset_paginated, keyset_paginated_schema, keyset_request
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
        items = []
        try:
            if reader.fieldnames is None or not {"end_user_id", "opted_in"} <= set(reader.fieldnames):
                raise ValidationFailed("body: the CSV needs a header row with end_user_id and opted_in")
            for row in reader:
                flag = (row.get("opted_in") or "").strip().lower()
                opted_in: Any = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(
                    flag, flag
                )
                items.append({"end_user_id": row.get("end_user_id"), "opted_in": opted_in})
        except csv.Error as exc:  # a field past the csv module's limit, a NUL, a broken quote
            raise ValidationFailed(f"body: the CSV cannot be read at line {reader.line_num}: {exc}") from None
        return {"items": items}


_FIGURES = ("total", "opted_in", "opted_out")


class EndUserListApi(ScopedApi):
    """The tenant's end users by id, searchable, a page at a time (by cursor, or by offset as
    older clients do), with the tenant's counts. Every count stops at a cap unless exact ones are
    asked for, so a page costs what it shows, not what the tenant holds."""

    required_scope = "ingest"

    @extend_schema(
        operation_id="v1_users_list",
        parameters=[
            OpenApiParameter(
                "search",
                str,
                description=f"any part of the end user id, in any case; under {SEARCH_MIN_CHARS} characters, its start",
            ),
            OpenApiParameter("opted_in", bool),
            OpenApiParameter("limit", int, description="users a page: 1 to 500, default 50"),
            OpenApiParameter(
                "cursor", str, description="a page's next_cursor: the page after it (the same filters apply)"
            ),
            OpenApiParameter(
                "offset", int, description="users to skip (not with cursor); each page costs what it skips"
            ),
            OpenApiParameter(
                "exact_counts",
                bool,
                description=(
                    "count and counts exact (true) or stopped at the cap (false); by default exact on pages "
                    "asked by offset, capped on pages asked by cursor"
                ),
            ),
        ],
        responses={
            200: keyset_paginated_schema(
                "EndUserPage",
                EndUserOut(many=True),
                counts=inline_serializer(
                    name="EndUserCounts", fields={n: serializers.IntegerField() for n in _FIGURES}
                ),
                counts_capped=inline_serializer(
                    name="EndUserCountsCapped", fields={n: serializers.BooleanField() for n in _FIGURES}
                ),
            )
        },
        description=(
            "Ordered by end user id. On a page asked by cursor (or with `exact_counts=false`) `count` (the "
            f"users that match) and `counts` stop at {COUNT_CAP:,} (`count` at one page past the one asked "
            "for, when further) and `count_capped` and `counts_capped` say a figure stopped there; a page "
            "asked by offset counts them all, as it always has, slowly on a big tenant. Follow "
            "`next_cursor` (or `next`) for the next page: it costs what the first one does."
        ),
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        reject_unknown_query(params, {"search", "opted_in", "limit", "offset", "cursor", "exact_counts"})
        asked = keyset_request(request)
        exact = query_bool(params, "exact_counts")
        if exact is None:  # pages by offset count exactly, as they always have; pages by cursor stop at the cap
            exact = asked.after is None
        users = end_user_list(self.tenant, search=query_text(params, "search"), opted_in=query_bool(params, "opted_in"))
        page = end_user_page(users, after=asked.after, per_page=asked.limit, offset=asked.offset)
        # Counted at least one page past this one: a client that pages while offset < count never stops early.
        count = capped_count(users, cap=None if exact else max(COUNT_CAP, asked.offset + 2 * asked.limit))
        response = keyset_paginated(
            request,
            asked,
            results=EndUserOut(page.object_list, many=True).data,
            next_after=page.next,
            count=count.value,
            count_capped=count.more,
        )
        counts = end_user_counts_capped(self.tenant, cap=None if exact else COUNT_CAP)
        response.data["counts"] = {name: figure.value for name, figure in counts.items()}
        response.data["counts_capped"] = {name: figure.more for name, figure in counts.items()}
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
