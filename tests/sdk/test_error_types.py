"""The error hierarchy: ``APIError`` is the base of every error met talking to the API (an error
status, no answer, an unreadable answer, an error event in a stream), and each carries the
answer's ``X-Request-ID``."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import httpx
import pytest
import strop
from strop import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AsyncCompletionStream,
    AsyncStrop,
    BadRequestError,
    CompletionStream,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    ServiceUnavailableError,
    StreamError,
    Strop,
    StropError,
)
from strop._core import read_json
from strop._exceptions import error_from_response

from apps.common.exceptions import error_object
from tests.sdk.conftest import closed_port

pytestmark = pytest.mark.django_db(transaction=True)

REQUEST = httpx.Request("GET", "http://strop.test/v1/interactions")


def answer(status: int, body: bytes = b"", **headers: str) -> httpx.Response:
    return httpx.Response(status, content=body, headers=headers, request=REQUEST)


def test_every_api_error_is_an_api_error_and_every_error_a_strop_error():
    error_classes = [getattr(strop, name) for name in strop._exceptions.__all__]
    assert all(getattr(strop, cls.__name__) is cls for cls in error_classes)  # all exported
    for cls in error_classes:
        assert issubclass(cls, StropError)
        assert issubclass(cls, APIError) or cls is StropError
    assert issubclass(ServiceUnavailableError, InternalServerError)
    assert issubclass(InternalServerError, APIStatusError) and issubclass(RateLimitError, APIStatusError)
    assert issubclass(APITimeoutError, APIConnectionError)
    assert not issubclass(StreamError, APIStatusError) and not issubclass(APIConnectionError, APIStatusError)


@pytest.mark.parametrize(
    ("status", "cls"),
    [(400, BadRequestError), (418, APIStatusError), (500, InternalServerError), (502, InternalServerError)]
    + [(503, ServiceUnavailableError), (429, RateLimitError), (404, NotFoundError)],
)
def test_each_status_gets_its_class(status, cls):
    error = error_from_response(answer(status, b'{"error": {"code": "x", "message": "m"}}', **{"X-Request-ID": "r1"}))
    assert type(error) is cls and (error.status_code, error.status, error.request_id) == (status, status, "r1")


def test_an_answer_that_is_not_json_is_an_api_error_with_its_text():
    response = answer(200, b"<html>proxy</html>")
    with pytest.raises(APIResponseValidationError) as caught:
        read_json(response)
    assert (caught.value.status_code, caught.value.body, caught.value.response) == (200, "<html>proxy</html>", response)


def test_an_error_status_carries_the_request_id_param_and_response(strop_client):
    with pytest.raises(APIError) as caught:  # a 400 is an APIError now, not only a 5xx
        strop_client.feedback.send(client_id="c-1", outcome="maybe")
    error = caught.value
    assert isinstance(error, BadRequestError)
    assert (error.status_code, error.code, error.param, error.field) == (400, "invalid", "outcome", "outcome")
    assert isinstance(error.response, httpx.Response) and error.response.status_code == 400
    assert error.request_id and error.request_id == error.response.headers["X-Request-ID"]
    assert error.request is error.response.request and error.request.url.path == "/v1/feedback"
    assert error.body["error"]["code"] == "invalid" and error.details["field"] == "outcome"


def test_the_request_id_is_the_one_the_caller_sent_when_it_sent_one(api):
    request_id = uuid.uuid4().hex
    with Strop(base_url=api.url, api_key=api.key, default_headers={"X-Request-ID": request_id}) as client:
        with pytest.raises(NotFoundError) as caught:
            client.interactions.get(str(uuid.uuid4()))
    assert caught.value.request_id == request_id


def test_a_refused_connection_is_an_api_error_without_an_answer():
    url = f"http://127.0.0.1:{closed_port()}"
    with Strop(base_url=url, api_key="strop_x_y", max_retries=0) as client:
        with pytest.raises(APIError) as caught:
            client.interactions.list()
    error = caught.value
    assert isinstance(error, APIConnectionError) and not isinstance(error, APITimeoutError)
    assert (error.status_code, error.request_id, error.response, error.param) == (None, None, None, None)
    assert error.request is not None and error.request.url.path == "/v1/interactions"


def test_a_streamed_call_refused_before_it_starts_has_its_request_id(strop_client):
    with pytest.raises(BadRequestError) as caught:
        strop_client.completions.create(prompt="x", prefix="y", stream=True)
    assert caught.value.request_id and caught.value.request_id == caught.value.response.headers["X-Request-ID"]
    assert caught.value.param == "prompt"


ERROR_EVENT = (
    b'data: {"id": "i-1", "choices": [{"index": 0, "text": "ret"}]}\n\n'
    b'data: {"error": {"code": "vllm_error", "message": "replica died", "details": {}}}\n\n'
)


def test_an_error_event_in_a_stream_raises_a_stream_error_with_the_request_id():
    stream = CompletionStream(answer(200, ERROR_EVENT, **{"X-Request-ID": "stream-1"}))
    first = next(stream)
    with pytest.raises(APIError) as caught:
        next(stream)
    assert first.choices[0].text == "ret"
    error = caught.value
    assert isinstance(error, StreamError)
    assert (error.status_code, error.code, error.message, error.request_id) == (
        200,
        "vllm_error",
        "replica died",
        "stream-1",
    )

    async def main() -> StreamError:
        stream = AsyncCompletionStream(answer(200, ERROR_EVENT, **{"X-Request-ID": "stream-2"}))
        with pytest.raises(StreamError) as caught:
            async for _ in stream:
                pass
        return caught.value

    assert asyncio.run(main()).request_id == "stream-2"


def test_a_stream_event_that_is_not_json_is_a_response_validation_error():
    stream = CompletionStream(answer(200, b"data: {oops\n\n", **{"X-Request-ID": "stream-3"}))
    with pytest.raises(APIResponseValidationError) as caught:
        list(stream)
    assert caught.value.request_id == "stream-3" and caught.value.body == "{oops"


def test_the_async_client_raises_the_same_errors(api):
    async def main() -> tuple[APIError, APIError]:
        async with AsyncStrop(base_url=api.url, api_key=api.key) as client:
            with pytest.raises(APIError) as status_error:
                await client.feedback.send(client_id="c-1", outcome="maybe")
        async with AsyncStrop(base_url=f"http://127.0.0.1:{closed_port()}", api_key="k", max_retries=0) as client:
            with pytest.raises(APIError) as connection_error:
                await client.models.list()
        return status_error.value, connection_error.value

    status_error, connection_error = asyncio.run(main())
    assert isinstance(status_error, BadRequestError) and status_error.request_id
    assert isinstance(connection_error, APIConnectionError) and connection_error.request_id is None


def test_errors_that_are_not_from_the_api_still_answer_the_api_attributes():
    error = StropError("no API key")
    assert (error.status_code, error.status, error.request_id, error.param, error.field) == (None,) * 5
    assert error.details == {} and str(error) == "no API key"


def test_the_error_objects_type_param_and_code_are_attributes():
    body = b'{"error": {"message": "max_tokens must be at least 1 (got -1)", "type": "invalid_request_error",'
    body += b' "param": "max_tokens", "code": "invalid", "details": {}}}'
    error = error_from_response(answer(400, body))
    assert (error.type, error.param, error.code) == ("invalid_request_error", "max_tokens", "invalid")
    # The API's param is taken as it is: null means no field is at fault, whatever the message says.
    unfielded = b'{"error": {"message": "body: not UTF-8", "type": "x", "param": null, "code": "x"}}'
    assert error_from_response(answer(400, unfielded)).param is None


def test_a_422_is_an_unprocessable_entity_error():
    error = error_from_response(answer(422, b'{"error": {"code": "adapter_rejected", "message": "m"}}'))
    assert type(error) is strop.UnprocessableEntityError and error.code == "adapter_rejected"


def test_the_readme_denies_no_exception_the_sdk_raises_and_no_field_the_api_sends():
    readme = (Path(__file__).resolve().parents[2] / "sdk" / "README.md").read_text()
    denied = set(re.findall(r"[Tt]here is no\s+`(\w+)`", readme)) | set(re.findall(r"has no\s+`(\w+)`", readme))
    sent = error_object("invalid", "m", status=400, param=None, details=None)
    assert not denied & (set(strop._exceptions.__all__) | set(sent))
