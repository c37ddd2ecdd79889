"""OpenAI-compatible completions and model listing, served by the tenant's adapters on vLLM.

The official ``openai`` client and editor plugins (Continue) are the references: every field of
OpenAI's completion request is taken, and what vLLM cannot do is a clear 400.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.adapters.selectors import adapter_list
from apps.common.apis import ScopedApi, end_user_of_request
from apps.common.exceptions import ApplicationError, Forbidden
from apps.common.parsing import StrictSerializer
from apps.engines.vllm_client import Completion, CompletionChoice, CompletionChunk
from apps.serving.completion_requests import CompletionRequest, suffix_shown
from apps.serving.completions import completion_create
from apps.serving.selectors import ReadAhead
from apps.serving.services import Route
from apps.tenants.permissions import acts_as_editor

MAX_STOP = 64
MAX_STOP_CHARS = 256
MAX_LOGIT_BIAS = 300
VLLM_MAX_LOGPROBS = 20
INT64 = 2**63 - 1


@extend_schema_field(
    {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP}]}
)
class StopField(serializers.Field):
    """``stop``: a string or a list of strings; any number up to MAX_STOP (vLLM's four are not the client's limit)."""

    def to_internal_value(self, data: Any) -> list[str]:
        values = [data] if isinstance(data, str) else data
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise serializers.ValidationError("must be a non-empty string or a list of them")
        if len(values) > MAX_STOP:
            raise serializers.ValidationError(f"at most {MAX_STOP} stop sequences")
        if any(len(v) > MAX_STOP_CHARS for v in values):
            raise serializers.ValidationError(f"a stop sequence is at most {MAX_STOP_CHARS} characters")
        return values

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field({"type": "object", "additionalProperties": {"type": "number"}})
class LogitBiasField(serializers.Field):
    """``logit_bias``: token id (as a string, as JSON objects need) → bias in [-100, 100]."""

    def to_internal_value(self, data: Any) -> dict[str, float]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object of token id to bias")
        if len(data) > MAX_LOGIT_BIAS:
            raise serializers.ValidationError(f"at most {MAX_LOGIT_BIAS} entries")
        out: dict[str, float] = {}
        for key, value in data.items():
            if not (key.isascii() and key.isdigit() and len(key) <= 10):
                raise serializers.ValidationError(f"key {key[:40]!r} is not a token id")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                raise serializers.ValidationError(f"the bias of token {key} must be a number from -100 to 100")
            out[key] = float(value)
        return out

    def to_representation(self, value: Any) -> Any:
        return value


class StreamOptionsIn(StrictSerializer):
    include_usage = serializers.BooleanField(required=False, default=False)


class CompletionIn(StrictSerializer):
    model = serializers.CharField(
        required=False, allow_blank=True, help_text="your adapter's name; default adapter if empty"
    )
    prompt = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="the prompt; a FIM prompt in another model's convention (<fim_prefix>…) is recognised and "
        "rebuilt for the base model",
    )
    prefix = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    suffix = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, default="")
    max_tokens = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2**31 - 1,
        default=16,
        help_text="served at most the adapter's max_completion_tokens (requests for more are capped, not refused)",
    )
    temperature = serializers.FloatField(required=False, min_value=0.0, max_value=2.0, default=1.0)
    top_p = serializers.FloatField(required=False, min_value=0.0001, max_value=1.0, default=1.0)
    stop = StopField(required=False, default=list)
    n = serializers.IntegerField(required=False, min_value=1, max_value=8, default=1)
    best_of = serializers.IntegerField(required=False, min_value=1, max_value=8)
    seed = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=-INT64, max_value=INT64)
    user = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
    stream = serializers.BooleanField(required=False, default=False)
    stream_options = StreamOptionsIn(required=False)
    logprobs = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=VLLM_MAX_LOGPROBS)
    echo = serializers.BooleanField(required=False, default=False)
    frequency_penalty = serializers.FloatField(required=False, min_value=-2.0, max_value=2.0)
    presence_penalty = serializers.FloatField(required=False, min_value=-2.0, max_value=2.0)
    logit_bias = LogitBiasField(required=False)
    opted_in = serializers.BooleanField(required=False, help_text="the end user's consent to learning, now")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("prompt" in attrs) == ("prefix" in attrs):
            raise serializers.ValidationError({"prompt": "send either `prompt`, or `prefix` (+ `suffix`) for FIM"})
        if attrs.get("best_of") is not None and attrs["best_of"] < attrs["n"]:
            raise serializers.ValidationError({"best_of": "must be at least n"})
        if attrs["echo"] and attrs.get("logprobs") is not None:
            raise serializers.ValidationError(
                {"echo": "echo with logprobs is not supported: Strop returns the logprobs of the completion only"}
            )
        return attrs


def _logprobs_body(choice: CompletionChoice) -> dict[str, Any]:
    return {
        "tokens": choice.tokens,
        "token_logprobs": choice.logprobs,
        "top_logprobs": choice.top_logprobs,
        "text_offset": choice.text_offset,
    }


class _Answer:
    """Shapes vLLM's answer (or stream chunks) as OpenAI's completion objects, Strop's fields added."""

    def __init__(self, request: CompletionRequest, route: Route, ids: list[str], model: str) -> None:
        self.request, self.route, self.ids, self.model = request, route, ids, model
        self.created = int(time.time())
        self.echoed: set[int] = set()
        self.strop: dict[str, Any] = {"version": route.vllm_model, "max_tokens": request.max_tokens}
        if request.max_tokens_requested is not None:
            self.strop["max_tokens_requested"] = request.max_tokens_requested
        if request.is_fim:
            self.strop["fim"] = {
                "convention": request.fim_convention or "prefix/suffix",
                "suffix_shown_to_model": suffix_shown(route.adapter.base_model, request),
            }

    def choice(self, choice: CompletionChoice) -> dict[str, Any]:
        text = choice.text
        if self.request.echo and choice.index not in self.echoed:
            self.echoed.add(choice.index)
            text = (self.request.prompt or self.request.prefix) + text
        return {
            "index": choice.index,
            "text": text,
            "logprobs": _logprobs_body(choice) if self.request.logprobs is not None else None,
            "finish_reason": choice.finish_reason,
            "interaction_id": self.ids[choice.index],
        }

    def body(self, completion: Completion | CompletionChunk) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.ids[0],
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self.choice(c) for c in completion.choices],
            "strop": self.strop,
        }
        if completion.usage is not None:
            usage = completion.usage
            body["usage"] = {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            }
        return body


def sse_response(bodies: Generator[dict[str, Any], None, None]) -> StreamingHttpResponse:
    """Server-sent events, one ``data: <JSON>`` per body; if vLLM fails mid-stream (the bodies
    raise), ``data: {"error": …}``, which the openai client raises as APIError; then ``[DONE]``."""

    def events() -> Iterator[bytes]:
        try:
            for body in bodies:
                yield b"data: " + orjson.dumps(body) + b"\n\n"
        except ApplicationError as exc:
            yield b"data: " + orjson.dumps({"error": exc.as_dict()}) + b"\n\n"
        finally:
            bodies.close()  # a client that left: the upstream closes now, and what was served is recorded
        yield b"data: [DONE]\n\n"

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


class ServingApi(ScopedApi):
    """Base of the completion endpoints: the adapter, the end user and the experiment they read
    first go in the API key's round trip (``read_ahead``, asked by ApiKeyAuthentication)."""

    required_scope = "serve"
    editor_allowed = True  # an editor key serves, without giving consent (end_user)
    ahead: ReadAhead | None = None

    def end_user(self, request: Request, attrs: dict[str, Any]) -> tuple[str, bool | None]:
        """The end user the request names and the consent it states (``end_user_of_request``).

        An editor key (a config file on every developer's machine, shared by a team) cannot say
        who the developer is with any proof, so it never gives consent: ``opted_in: true`` (or
        ``X-Strop-Opt-In: true``) through it is a 403. Withdrawing (false) is always taken; a user
        it is the first to see gets the key's ``default_opt_in``, else the tenant's."""
        user, flag = end_user_of_request(request, attrs)
        if flag is True and acts_as_editor(request.user, self.required_scope):
            raise Forbidden(
                "an editor key cannot give an end user's consent to learning (opted_in / X-Strop-Opt-In: true): "
                "leave it out (a new developer gets the key's default_opt_in) and have an admin opt people in; "
                "opting out (false) is allowed",
                code="permission_denied",
            )
        return user, flag

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
        model, user = body.get("model") or "", body.get("user") or request.headers.get("X-Strop-User", "")
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
    def post(self, request: Request) -> Response | StreamingHttpResponse:
        data = CompletionIn(data=request.data)
        data.is_valid(raise_exception=True)
        user, flag = self.end_user(request, data.validated_data)
        answer = completion_create(
            self.tenant,
            fields=data.validated_data,
            user=user,
            flag=flag,
            api_key=request.auth,
            actor=self.actor,
            ahead=self.ahead,
        )
        shape = _Answer(answer.request, answer.route, [str(i) for i in answer.ids], answer.adapter_name)
        if answer.chunks is not None:
            return sse_response(shape.body(chunk) for chunk in answer.chunks)
        return Response(shape.body(answer.completion))


class ModelOut(serializers.Serializer):
    id = serializers.CharField(help_text="the adapter's name: what `model` takes")
    object = serializers.CharField(default="model")
    created = serializers.IntegerField()
    owned_by = serializers.CharField()
    root = serializers.CharField(help_text="the base model the adapter is trained on")
    parent = serializers.CharField(allow_null=True)


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
