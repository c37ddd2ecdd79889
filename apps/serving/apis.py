from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
from django.http import StreamingHttpResponse
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.adapters.selectors import adapter_get_for_tenant
from apps.common.apis import ScopedApi
from apps.serving.services import CompletionRequest, completion_serve, completion_stream, serving_route
from apps.serving.vllm_client import Completion, CompletionChoice, CompletionChunk, VLLMError

MAX_STOP = 4


class StopField(serializers.Field):
    def to_internal_value(self, data: Any) -> list[str]:
        values = [data] if isinstance(data, str) else data
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise serializers.ValidationError("must be a non-empty string or a list of them")
        if len(values) > MAX_STOP:
            raise serializers.ValidationError(f"at most {MAX_STOP} stop sequences")
        return values

    def to_representation(self, value: Any) -> Any:
        return value


class CompletionIn(serializers.Serializer):
    model = serializers.CharField(
        required=False, allow_blank=True, help_text="your adapter's name; default adapter if empty"
    )
    prompt = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    prefix = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    suffix = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, default="")
    max_tokens = serializers.IntegerField(required=False, min_value=1, max_value=4096, default=16)
    temperature = serializers.FloatField(required=False, min_value=0.0, max_value=2.0, default=1.0)
    top_p = serializers.FloatField(required=False, min_value=0.0001, max_value=1.0, default=1.0)
    stop = StopField(required=False, default=list)
    n = serializers.IntegerField(required=False, min_value=1, max_value=8, default=1)
    seed = serializers.IntegerField(required=False, allow_null=True, default=None)
    user = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
    stream = serializers.BooleanField(required=False, default=False)
    opted_in = serializers.BooleanField(required=False, default=False, help_text="the end user opted in to learning")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("prompt" in attrs) == ("prefix" in attrs):
            raise serializers.ValidationError({"prompt": "send either `prompt`, or `prefix` (+ `suffix`) for FIM"})
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError({sorted(unknown)[0]: "is not a supported field"})
        return attrs


def _choice_body(choice: CompletionChoice, interaction_id: str) -> dict[str, Any]:
    return {
        "index": choice.index,
        "text": choice.text,
        "logprobs": None,
        "finish_reason": choice.finish_reason,
        "interaction_id": interaction_id,
    }


def _body(completion: Completion | CompletionChunk, ids: list[str], model: str, version: str, created: int) -> dict:
    body: dict[str, Any] = {
        "id": ids[0],
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [_choice_body(c, ids[c.index]) for c in completion.choices],
        "strop": {"version": version},
    }
    if completion.usage is not None:
        usage = completion.usage
        body["usage"] = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }
    return body


class CompletionApi(ScopedApi):
    """OpenAI-compatible completions, served by the tenant's adapter on vLLM and recorded."""

    required_scope = "serve"

    @extend_schema(
        request=CompletionIn,
        responses={200: inline_serializer(name="CompletionOut", fields={"id": serializers.CharField()})},
        description="`model` names your adapter (empty: your default). Send `prompt`, or `prefix` + `suffix` and "
        "Strop builds the base model's fill-in-the-middle prompt. `id` (and each choice's `interaction_id`) is "
        "the interaction to send feedback on. An empty `text` means the model chose to suggest nothing. "
        "`stream: true` answers with server-sent events as OpenAI does. 503 with Retry-After when vLLM is down.",
    )
    def post(self, request: Request) -> Response | StreamingHttpResponse:
        data = CompletionIn(data=request.data)
        data.is_valid(raise_exception=True)
        attrs = data.validated_data
        adapter = adapter_get_for_tenant(self.tenant, name=attrs.get("model") or None)
        route = serving_route(self.tenant, adapter=adapter, end_user_id=attrs["user"])
        served = CompletionRequest(
            prompt=attrs.get("prompt", ""),
            prefix=attrs.get("prefix", ""),
            suffix=attrs["suffix"],
            is_fim="prefix" in attrs,
            max_tokens=attrs["max_tokens"],
            temperature=attrs["temperature"],
            top_p=attrs["top_p"],
            stop=attrs["stop"],
            n=attrs["n"],
            seed=attrs["seed"],
            user=attrs["user"],
            opted_in=attrs["opted_in"],
        )
        created = int(time.time())
        if attrs["stream"]:
            ids, chunks = completion_stream(self.tenant, route=route, request=served)
            events = _sse(chunks, [str(i) for i in ids], adapter.name, route.vllm_model, created)
            response = StreamingHttpResponse(events, content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"
            return response
        completion, ids = completion_serve(self.tenant, route=route, request=served)
        return Response(_body(completion, [str(i) for i in ids], adapter.name, route.vllm_model, created))


def _sse(chunks: Iterator[CompletionChunk], ids: list[str], model: str, version: str, created: int) -> Iterator[bytes]:
    try:
        for chunk in chunks:
            yield b"data: " + orjson.dumps(_body(chunk, ids, model, version, created)) + b"\n\n"
    except VLLMError as exc:
        yield b"data: " + orjson.dumps({"error": exc.as_dict()}) + b"\n\n"
    yield b"data: [DONE]\n\n"
