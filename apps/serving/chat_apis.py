"""OpenAI-compatible chat completions, served by the tenant's adapters on vLLM (agents).

The official ``openai`` client's ``chat.completions.create`` is the reference: OpenAI's request
fields are taken, plus Strop's ``conversation_id`` / ``turn`` (a multi-turn session is one
thread) and ``opted_in``; anything else is a 400 that names the field.

Schemas a tenant sends (``tools``' parameters, ``response_format``'s JSON schema) go into the
shared engine's prompt and its structured-output grammar, whose compile time grows with their
size and nesting: they are bounded here, far above what real clients send (the openai client's
and Continue's tools are a few hundred bytes each, a handful of levels deep), and a request past
a bound is a 400 that names the field and the limit before anything reaches vLLM. The keywords
that cost a grammar more than its size (``pattern``, large ``enum``s and counts) are bounded by
:mod:`apps.serving.schema_bounds`, in ``response_format`` and in the tools a ``tool_choice``
forces (vLLM compiles those parameters into a grammar too).
"""

from __future__ import annotations

from django.http.response import HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request

from apps.serving.apis import ServingApi
from apps.serving.async_views import Planned
from apps.serving.chat import ChatAnswer, chat_plan, chat_serve, chat_stream
from apps.serving.chat_schemas import ChatCompletionIn

_CHAT_OUT = inline_serializer(
    name="ChatCompletionOut",
    fields={
        "id": serializers.CharField(help_text="the interaction to send feedback on (the first choice's)"),
        "object": serializers.CharField(),
        "created": serializers.IntegerField(),
        "model": serializers.CharField(),
        "choices": serializers.ListField(
            child=inline_serializer(
                name="ChatChoiceOut",
                fields={
                    "index": serializers.IntegerField(),
                    "message": serializers.DictField(help_text="role, content, tool_calls"),
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


class ChatCompletionApi(ServingApi):
    """OpenAI-compatible chat completions, served by the tenant's adapter on vLLM and recorded."""

    @extend_schema(
        request=ChatCompletionIn,
        responses={
            (200, "application/json"): OpenApiResponse(
                _CHAT_OUT,
                description="OpenAI's chat completion; each choice has `interaction_id` (the turn to send "
                "feedback on), `id` is the first choice's, and `strop` says which version served it",
            ),
            (200, "text/event-stream"): OpenApiResponse(
                {  # one server-sent event
                    "type": "object",
                    "required": ["data"],
                    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
                },
                description="With `stream: true`: one `data: <chat.completion.chunk>` per chunk, "
                '`data: {"error": …}` if vLLM fails mid-stream, then `data: [DONE]`',
            ),
        },
        description="`model` names your adapter (empty: your default). `conversation_id` and `turn` make a "
        "multi-turn session one thread, for session feedback and the dashboard. 503 with Retry-After when vLLM "
        "is down.",
    )
    def post(self, request: Request) -> HttpResponseBase:
        data = ChatCompletionIn(data=request.data)
        data.is_valid(raise_exception=True)
        plan, lease = self.plan_under_lease(request, data.validated_data, chat_plan)
        answer = ChatAnswer(plan.request, plan.route, plan.ids, plan.adapter_name)
        return Planned(plan, shape=answer.body, serve=chat_serve, stream=chat_stream, lease=lease)
