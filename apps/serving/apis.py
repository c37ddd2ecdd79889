"""OpenAI-compatible completions and model listing, served by the tenant's adapters on vLLM.

The official ``openai`` client and editor plugins (Continue) are the references: every field of
OpenAI's completion request is taken, and what vLLM cannot do is a clear 400. The views only: the
request's fields are in ``schemas.py``, the answer's shape and its server-sent events in ``answers.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http.response import HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.mediatypes import media_type_matches

from apps.adapters.selectors import adapter_list
from apps.common.apis import ScopedApi
from apps.common.parsing import header_text
from apps.serving.admission import stream_lease_return, stream_lease_take
from apps.serving.answers import EVENT_STREAM, CompletionAnswer
from apps.serving.async_views import Planned, serving_view
from apps.serving.completions import completion_plan, completion_serve, completion_stream
from apps.serving.schemas import CompletionIn
from apps.serving.selectors import ReadAhead
from apps.tenants.request_consent import end_user_and_consent


class ServingNegotiation(DefaultContentNegotiation):
    """The completion endpoints answer JSON, or server-sent events for a stream (sent by
    ``apps.serving.async_views``, not by a DRF renderer). A client that accepts only
    ``text/event-stream`` (an SSE client library asking for a stream) is answered too, as OpenAI's
    API answers it: DRF renders JSON for what it answers (errors), a stream goes as events. Any other
    ``Accept`` without JSON is a 406 as on every endpoint."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderers = list(renderers)
        try:
            return super().select_renderer(request, renderers, format_suffix)  # type: ignore[no-any-return]
        except NotAcceptable:
            if any(media_type_matches(EVENT_STREAM, accepted) for accepted in self.get_accept_list(request)):
                return renderers[0], renderers[0].media_type
            raise


class ServingApi(ScopedApi):
    """Base of the completion endpoints: the adapter, the end user and the experiment they read
    first go in the API key's round trip (``read_ahead``, asked by ApiKeyAuthentication)."""

    required_scope = "serve"
    editor_allowed = True  # an editor key serves, without giving consent (end_user)
    content_negotiation_class = ServingNegotiation
    ahead: ReadAhead | None = None

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Any:
        """The endpoint as an asynchronous view (``apps.serving.async_views``): this class's
        ``post`` answers a :class:`Planned` response that the view serves on the event loop."""
        return serving_view(super().as_view(**initkwargs), endpoint=cls.__name__)

    def plan_under_lease(self, request: Request, fields: dict[str, Any], plan: Callable[..., Any]) -> tuple[Any, Any]:
        """(``plan(...)``'s plan for this request, the tenant's stream lease or None). The tenant's
        stream cap is taken first, so a refused stream writes nothing and is charged no more than
        the one rate-limit unit the API key's check already took (``HasScope``), never its work
        (``serving_request_route``); the lease goes back if planning fails."""
        lease = stream_lease_take(self.tenant) if fields["stream"] else None
        try:
            user, flag = end_user_and_consent(request, fields, required=self.required_scope)
            planned = plan(
                self.tenant,
                fields=fields,
                user=user,
                flag=flag,
                api_key=self.api_key,
                actor=self.actor,
                ahead=self.ahead,
            )
        except BaseException:
            stream_lease_return(lease)
            raise
        return planned, lease

    def read_ahead(self, request: Request) -> ReadAhead | None:
        """The adapter name and end user the raw JSON body names (the user header otherwise), as
        the validated body will; None when the body cannot say (not JSON, too large, odd types).
        The body is parsed again, strictly, after authentication."""
        django_request = request._request
        try:
            length = int(django_request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return None
        if not 0 < length <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE or "json" not in (request.content_type or ""):
            return None
        try:
            body = orjson.loads(django_request.body)
        except (orjson.JSONDecodeError, RequestDataTooBig, OSError):
            return None
        if not isinstance(body, dict):
            return None
        model, user = body.get("model") or "", body.get("user") or header_text(request.headers, "X-Strop-User")
        if not (_storable(model) and _storable(user)):
            return None  # validation answers (a 400), after authentication
        self.ahead = ReadAhead(name=model.strip() or None, external_id=user.strip())
        return self.ahead


def _storable(value: Any) -> bool:
    """A string Postgres can take as a parameter (no NUL), of a sane length. A lone surrogate never
    gets here: orjson refuses it in the body, and a header is decoded as Latin-1."""
    return isinstance(value, str) and len(value) <= 1000 and "\x00" not in value


_COMPLETION_OUT = inline_serializer(
    name="CompletionOut",
    fields={
        "id": serializers.CharField(help_text="the interaction to send feedback on (the first choice's)"),
        "object": serializers.CharField(),
        "created": serializers.IntegerField(),
        "model": serializers.CharField(),
        "choices": serializers.ListField(
            child=inline_serializer(
                name="CompletionChoiceOut",
                fields={
                    "index": serializers.IntegerField(),
                    "text": serializers.CharField(allow_blank=True),
                    "logprobs": serializers.DictField(allow_null=True),
                    "finish_reason": serializers.CharField(allow_null=True),
                    "interaction_id": serializers.CharField(),
                },
            )
        ),
        "usage": serializers.DictField(required=False),
        "strop": serializers.DictField(),
    },
)


class CompletionApi(ServingApi):
    """OpenAI-compatible completions, served by the tenant's adapter on vLLM and recorded."""

    @extend_schema(
        request=CompletionIn,
        responses={
            (200, "application/json"): OpenApiResponse(_COMPLETION_OUT, description="a completion"),
            (200, "text/event-stream"): OpenApiResponse(
                {  # one server-sent event
                    "type": "object",
                    "required": ["data"],
                    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
                },
                description="With `stream: true`, server-sent events (`text/event-stream`): one "
                '`data: <CompletionOut>` per chunk, `data: {"error": …}` if vLLM fails mid-stream, then '
                "`data: [DONE]`. The usage chunk (empty `choices`) comes only with "
                '`stream_options: {"include_usage": true}`.',
            ),
        },
        description="`model` names your adapter (empty: your default). Send `prompt`, or `prefix` + `suffix` and "
        "Strop builds the base model's fill-in-the-middle prompt. `id` (and each choice's `interaction_id`) is "
        "the interaction to send feedback on. An empty `text` means the model chose to suggest nothing. "
        "503 with Retry-After when vLLM is down.",
    )
    def post(self, request: Request) -> HttpResponseBase:
        data = CompletionIn(data=request.data)
        data.is_valid(raise_exception=True)
        plan, lease = self.plan_under_lease(request, data.validated_data, completion_plan)
        shape = CompletionAnswer(plan.request, plan.route, [str(i) for i in plan.ids], plan.adapter_name)
        return Planned(plan, shape=shape.body, serve=completion_serve, stream=completion_stream, lease=lease)


class ModelOut(serializers.Serializer):
    id = serializers.CharField(help_text="the adapter's name: what `model` takes")
    object = serializers.CharField(default="model")
    created = serializers.IntegerField()
    owned_by = serializers.CharField()
    # OpenAI's model object names these two; a serializer's declared fields never shadow the
    # field attributes of the same names (DRF moves them into ``_declared_fields``).
    root = serializers.CharField(help_text="the base model the adapter is trained on")  # type: ignore[assignment]
    parent = serializers.CharField(allow_null=True)  # type: ignore[assignment]


class ModelListApi(ScopedApi):
    """The tenant's adapters in OpenAI's model-list shape (what `client.models.list()` reads)."""

    required_scope = "any"

    @extend_schema(
        responses={
            200: inline_serializer(
                name="ModelList", fields={"object": serializers.CharField(), "data": ModelOut(many=True)}
            ),
        }
    )
    def get(self, request: Request) -> Response:
        data = [
            {
                "id": adapter.name,
                "object": "model",
                "created": int(adapter.created_at.timestamp()),
                "owned_by": self.tenant.slug,
                "root": adapter.base_model.name,
                "parent": None,
            }
            for adapter in adapter_list(self.tenant)
        ]
        return Response({"object": "list", "data": data})
