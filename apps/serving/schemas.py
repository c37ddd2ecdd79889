"""The completion request as the API takes it: OpenAI's fields, each checked, with what vLLM cannot do
refused by name (the views are in ``apis.py``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.common.parsing import StrictSerializer
from apps.serving.prompts import parse_fim_prompt

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


class OpenAIRequestIn(StrictSerializer):
    """A request in OpenAI's shape: an optional field sent as ``null`` is taken as not sent (its
    default), as OpenAI's API takes it; clients other than the official one send them. A field whose
    null means something of its own (``allow_null``) keeps it."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            fields = self.fields
            data = {
                key: value
                for key, value in data.items()
                if value is not None or key not in fields or fields[key].required or fields[key].allow_null
            }
        return super().to_internal_value(data)


class OpenAIRequestSchema(OpenApiSerializerExtension):
    """The published schema says what ``OpenAIRequestIn`` takes: each optional field is ``nullable`` (a
    null is taken as not sent), so a generated client may send one."""

    target_class = OpenAIRequestIn
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction == "request":
            required = set(schema.get("required", ()))
            for name, prop in schema.get("properties", {}).items():
                if name in required:
                    continue
                if "$ref" in prop:  # OpenAPI 3.0 ignores a $ref's siblings
                    schema["properties"][name] = prop = {"allOf": [{"$ref": prop.pop("$ref")}], **prop}
                prop["nullable"] = True
        return schema


class StreamOptionsIn(OpenAIRequestIn):
    include_usage = serializers.BooleanField(required=False, default=False)
    # OpenAI's client declares it (ChatCompletionStreamOptionsParam): padding on each chunk against
    # size side channels. Strop's chunks carry none; the option is taken and changes nothing.
    include_obfuscation = serializers.BooleanField(
        required=False, help_text="accepted for OpenAI's clients and ignored: Strop's chunks carry no obfuscation"
    )


class CompletionIn(OpenAIRequestIn):
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
        if attrs.get("suffix") and "prompt" in attrs and parse_fim_prompt(attrs["prompt"]) is not None:
            raise serializers.ValidationError(
                {"suffix": "the prompt is a FIM prompt, which holds its own suffix; send the suffix in one place"}
            )
        if attrs.get("best_of") is not None and attrs["best_of"] < attrs["n"]:
            raise serializers.ValidationError({"best_of": "must be at least n"})
        if attrs["echo"] and attrs.get("logprobs") is not None:
            raise serializers.ValidationError(
                {"echo": "echo with logprobs is not supported: Strop returns the logprobs of the completion only"}
            )
        return attrs
