"""vLLM killed in the middle of a streamed completion: the client gets an error event and
[DONE] (the official openai client raises APIError), the request is recorded as a serving
failure and never as half an interaction, and while vLLM is down every request is a quick 503.

The vLLM server here is this test's own (the session's is shared by other tests; this one is
launched early, see conftest.py); the API is gunicorn."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from apps.adapters.models import Adapter
from apps.adapters.services import adapter_create, base_model_register
from apps.interactions.models import Interaction
from apps.serving.models import ServingFailure
from tests.fixtures.workers import _database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LONG = 900  # tokens: seconds of generation on CPU, far longer than it takes to kill vLLM
NEVER = ["\x07never-1\x07", "\x07never-2\x07", "\x07never-3\x07", "\x07never-4\x07", "\x07never-5\x07"]
EOS_TOKEN_ID = 0  # the starter model's <|endoftext|>: biased away, so the model cannot end early


class _Tee(httpx.SyncByteStream):
    """The response body as the client reads it, copied into ``received``; on close, the rest
    the server sent (the openai client stops reading at an error event)."""

    def __init__(self, inner: httpx.SyncByteStream, received: list[bytes]) -> None:
        self.inner, self.received = inner, received

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.received.append(chunk)
            yield chunk

    def close(self) -> None:
        try:
            for chunk in self.inner:
                self.received.append(chunk)
        except httpx.HTTPError:
            pass  # a body cut short shows in what was received
        finally:
            self.inner.close()


class _RecordingTransport(httpx.HTTPTransport):
    def __init__(self, received: list[bytes]) -> None:
        super().__init__()
        self.received = received

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.stream = _Tee(response.stream, self.received)  # type: ignore[arg-type]
        return response


@contextmanager
def _throttled(pgid: int, *, run_s: float = 0.01, pause_s: float = 0.09) -> Iterator[None]:
    """vLLM runs a tenth of the time (SIGSTOP / SIGCONT to its process group) until the block
    ends, stopped. On a loaded machine the client may read its first chunk seconds after vLLM
    sent it; at full speed the tiny model could finish all its tokens in that time, and the kill
    would come after a complete stream. Throttled, the stream is still far from its end."""
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            os.killpg(pgid, signal.SIGCONT)
            time.sleep(run_s)
            os.killpg(pgid, signal.SIGSTOP)
            time.sleep(pause_s)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()  # vLLM is left stopped: nothing more leaves it before the kill


def test_vllm_killed_mid_stream_is_an_error_event_a_failure_row_and_no_half_interaction(
    vllm_to_kill, api_servers, make_tenant, make_client, settings
):
    import openai

    proc, vllm = vllm_to_kill
    tenant = make_tenant(f"kill-{uuid.uuid4().hex[:6]}")
    base = base_model_register(name=vllm.served_model_name, path=vllm.model_dir)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    Adapter.objects.filter(pk=adapter.pk).update(max_completion_tokens=LONG)
    key = make_client(tenant, scopes=["serve"]).raw_key
    api = api_servers.start(
        database_url=_database_url(),
        REDIS_URL=settings.REDIS_URL,
        VLLM_BASE_URLS=vllm.base_url,
        VLLM_MAX_LORA_RANK=str(vllm.max_lora_rank),
    )

    received: list[bytes] = []
    client = openai.OpenAI(
        base_url=f"{api.url}/v1",
        api_key=key,
        max_retries=0,
        http_client=httpx.Client(transport=_RecordingTransport(received), timeout=120),
    )
    chunks = []
    with pytest.raises(openai.APIError) as raised:
        with _throttled(proc.pid):
            stream = client.completions.create(
                model="tab",
                prompt="def parse(line):\n",
                max_tokens=LONG,
                stop=NEVER,
                logit_bias={str(EOS_TOKEN_ID): -100},
                temperature=1.0,
                seed=7,
                user="dev-1",
                stream=True,
            )
            reading = iter(stream)
            chunks.append(next(reading))
        os.killpg(proc.pid, signal.SIGKILL)  # the API server, its engine core, everything
        for chunk in reading:
            chunks.append(chunk)
    assert chunks and chunks[0].choices[0].finish_reason is None, "the stream ended before vLLM was killed"
    error = raised.value
    # An error event, not a connection the API dropped (openai's APIConnectionError is an APIError too).
    assert type(error) is openai.APIError, repr(error)
    assert isinstance(error.body, dict) and error.body["code"] == "vllm_unavailable", error.body
    events = [e for e in b"".join(received).decode().split("\n\n") if e.strip()]
    assert events[-2].startswith('data: {"error":') and events[-1] == "data: [DONE]", events[-3:]
    assert all(e.startswith("data: {") for e in events[:-1]) and len(events) >= 3  # a chunk, the error, [DONE]

    failures = list(ServingFailure.objects.filter(tenant=tenant))
    assert [(f.streamed, f.kind) for f in failures] == [(True, "vllm_unavailable")]
    assert not Interaction.objects.filter(tenant=tenant).exists()  # failed, or nothing: never half

    # vLLM is down: the next requests are quick 503s with Retry-After, streamed or not.
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "tab", "prompt": "def f(x):\n", "max_tokens": 8, "user": "dev-1"}
    for stream_it in (False, True):
        started = time.monotonic()
        response = httpx.post(
            f"{api.url}/v1/completions", json={**body, "stream": stream_it}, headers=headers, timeout=60
        )
        took = time.monotonic() - started
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "vllm_unavailable"
        assert int(response.headers["Retry-After"]) >= 1
        assert took < 10, f"a request while vLLM is down took {took:.1f} s"  # not vLLM's 30 s timeout
    assert ServingFailure.objects.filter(tenant=tenant, streamed=False).count() == 2
    assert not Interaction.objects.filter(tenant=tenant).exists()
