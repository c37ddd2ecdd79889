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
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from apps.adapters.models import Adapter
from apps.adapters.services import adapter_create, base_model_register
from apps.interactions.models import Interaction, ServingFailure
from tests.fixtures.workers import _database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LONG = 1000  # tokens (the test server's context is 1024): throttled, tens of seconds of generation
NEVER = ["\x07never-1\x07", "\x07never-2\x07", "\x07never-3\x07", "\x07never-4\x07", "\x07never-5\x07"]
EOS_TOKEN_ID = 0  # the starter model's <|endoftext|>: biased away, so the model cannot end early


class _Tee(httpx.SyncByteStream):
    """The response body as the client reads it, copied into ``received``; on close, the rest
    the server sent (the openai client stops reading at an error event). ``on_first`` runs when
    the first bytes of the body arrive, before the client sees them."""

    def __init__(self, inner: httpx.SyncByteStream, received: list[bytes], on_first: Callable[[], None]) -> None:
        self.inner, self.received, self.on_first = inner, received, on_first

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            if not self.received:
                self.on_first()
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
    def __init__(self, received: list[bytes], on_first: Callable[[], None]) -> None:
        super().__init__()
        self.received, self.on_first = received, on_first

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.stream = _Tee(response.stream, self.received, self.on_first)  # type: ignore[arg-type]
        return response


def _engine_pids(pgid: int) -> list[int]:
    """vLLM's engine processes (EngineCore, its workers): every process of the server's group but
    the API server itself (the group's leader)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pgid:
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; fields[2] is the pgrp
        if int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


@contextmanager
def _throttled(pgid: int, *, run_s: float = 0.005, pause_s: float = 0.095) -> Iterator[Callable[[], None]]:
    """vLLM's engine runs a twentieth of the time (SIGSTOP / SIGCONT to its processes) while its
    API server runs freely, so each token reaches the client soon after it is sampled; a CPU
    engine at full speed keeps its own API server from sending anything until it has finished.
    ``freeze`` (yielded; called by the test the moment the stream's first bytes reach the
    client, and when the block ends) stops the engine for good: no SIGCONT can follow it, and
    the stream stays mid-way however slowly a loaded machine delivers that first chunk."""
    engine = _engine_pids(pgid)
    assert engine, "no vLLM engine process found in the server's process group"
    done = threading.Event()
    lock = threading.Lock()

    def signal_engine(signum: int) -> None:
        for pid in engine:
            os.kill(pid, signum)

    def freeze() -> None:
        with lock:
            done.set()
            signal_engine(signal.SIGSTOP)

    def cycle() -> None:
        while True:
            with lock:
                if done.is_set():
                    return
                signal_engine(signal.SIGCONT)
            time.sleep(run_s)
            signal_engine(signal.SIGSTOP)
            time.sleep(pause_s)

    signal_engine(signal.SIGSTOP)
    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield freeze
    finally:
        freeze()
        thread.join()  # the engine is left stopped: nothing more is sampled before the kill


def _vllm_gauges(base_url: str) -> tuple[float, float]:
    """(requests running, requests finished) as vLLM's own metrics say. Its API server keeps
    answering while the engine is stopped, with what the engine reported at its last step."""
    running = finished = 0.0
    for line in httpx.get(f"{base_url}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == "vllm:num_requests_running":
            running += float(line.rsplit(" ", 1)[1])
        elif name == "vllm:request_success_total":
            finished += float(line.rsplit(" ", 1)[1])
    return running, finished


def _settled_gauges(base_url: str) -> tuple[float, float]:
    """The gauges once two readings a second apart agree: with the engine stopped, only what was
    already on its way from it to the API server can still change them."""
    last = _vllm_gauges(base_url)
    for _ in range(30):
        time.sleep(1.0)
        now = _vllm_gauges(base_url)
        if now == last:
            return now
        last = now
    return last


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

    # The kill must come while vLLM is still generating. On a loaded machine the first chunk can
    # reach the client only after vLLM finished every token; vLLM's own metrics, read with its
    # engine stopped, say whether it did, and then the try is run again (never the assertions).
    tries = []
    for attempt in range(3):
        received: list[bytes] = []
        frozen: list[Callable[[], None]] = []
        transport = _RecordingTransport(received, lambda frozen=frozen: frozen[0]())
        client = openai.OpenAI(
            base_url=f"{api.url}/v1",
            api_key=key,
            max_retries=0,
            http_client=httpx.Client(transport=transport, timeout=120),
        )
        _, finished_before = _settled_gauges(vllm.base_url)
        interactions_before = Interaction.objects.filter(tenant=tenant).count()
        with _throttled(proc.pid) as freeze:
            frozen.append(freeze)
            stream = client.completions.create(
                model="tab",
                prompt="def parse(line):\n",
                max_tokens=LONG,
                stop=NEVER,
                logit_bias={str(EOS_TOKEN_ID): -100},
                temperature=1.0,
                seed=7 + attempt,
                user="dev-1",
                stream=True,
            )
            reading = iter(stream)
            chunks = [next(reading)]
        running, finished = _settled_gauges(vllm.base_url)  # the engine is stopped for good here
        tries.append({"running": running, "finished": finished - finished_before, "chunks": len(received)})
        if running >= 1 and finished == finished_before:
            break
        for pid in _engine_pids(proc.pid):
            os.kill(pid, signal.SIGCONT)
        chunks.extend(reading)  # vLLM finished it: read it to its end, a whole interaction
    else:
        pytest.fail(f"vLLM finished every try before it could be killed mid-way: {tries}")

    os.killpg(proc.pid, signal.SIGKILL)  # the API server, its engine core, everything
    with pytest.raises(openai.APIError) as raised:
        for chunk in reading:
            chunks.append(chunk)
    assert chunks[0].choices[0].finish_reason is None, "the stream ended before vLLM was killed"
    error = raised.value
    # An error event, not a connection the API dropped (openai's APIConnectionError is an APIError too).
    assert type(error) is openai.APIError, repr(error)
    assert isinstance(error.body, dict) and error.body["code"] == "vllm_unavailable", error.body
    events = [e for e in b"".join(received).decode().split("\n\n") if e.strip()]
    assert events[-2].startswith('data: {"error":') and events[-1] == "data: [DONE]", events[-3:]
    assert all(e.startswith("data: {") for e in events[:-1]) and len(events) >= 3  # a chunk, the error, [DONE]

    failures = list(ServingFailure.objects.filter(tenant=tenant))
    assert [(f.streamed, f.kind) for f in failures] == [(True, "vllm_unavailable")]
    # Failed, or nothing: never half (an earlier try that vLLM finished is a whole interaction).
    assert Interaction.objects.filter(tenant=tenant).count() == interactions_before

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
    assert Interaction.objects.filter(tenant=tenant).count() == interactions_before
