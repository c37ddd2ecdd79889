"""The serving endpoints under the ASGI server (gunicorn's uvicorn workers, as the Procfile runs
the API): what Strop added in a header and in /metrics, every served completion recorded (a
client that leaves mid-stream, a worker stopped mid-stream), and backpressure as 429 / 503 with
Retry-After. Upstream is benchmarks/mock_vllm.py, paced at 50 ms a token (vLLM's wire format;
vLLM itself cannot be paced, and these streams must still be going when the test acts); the
official openai client is the client."""

from __future__ import annotations

import os
import signal
import time
import uuid
from datetime import timedelta

import httpx
import openai
import pytest
from django.utils import timezone

from apps.adapters.models import Adapter
from apps.adapters.services import adapter_create, base_model_register
from apps.interactions.models import Feedback, Interaction, ServingFailure, StreamPart
from apps.interactions.stream_parts import stream_parts_sweep
from tests.fixtures.workers import _database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOKENS = [f" t{i}" for i in range(400)]


@pytest.fixture
def starter_dir() -> str:
    from model_supply.starter import ensure_starter_model

    return str(ensure_starter_model("tiny"))


@pytest.fixture
def fleet(mock_upstream, starter_dir, make_tenant, make_client):
    """``make(**env) -> (api, key_of)``: the API on the mock upstream; ``key_of(name)`` a serve key
    of a fresh tenant whose default adapter "tab" runs on the mock's base model."""
    base = base_model_register(name=mock_upstream.model, path=starter_dir)

    def key_of(name: str, scopes: tuple[str, ...] = ("serve",)) -> str:
        tenant = make_tenant(f"{name}-{uuid.uuid4().hex[:6]}")
        adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
        Adapter.objects.filter(pk=adapter.pk).update(max_completion_tokens=400)
        return make_client(tenant, scopes=list(scopes)).raw_key

    return key_of


def _api(api_servers, settings, mock_upstream, **env: str):
    return api_servers.start(
        database_url=_database_url(), REDIS_URL=settings.REDIS_URL, VLLM_BASE_URLS=mock_upstream.base_url, **env
    )


def _client(api, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0, timeout=60)


def _recorded(interaction_id: str, *, tokens: int | None = None, timeout_s: float = 60.0) -> Interaction:
    """The interaction once it is recorded (with ``tokens`` completion tokens, if given)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = Interaction.objects.filter(pk=interaction_id).first()
        if found is not None and (tokens is None or len(found.completion_token_ids) == tokens):
            return found
        assert time.monotonic() < deadline, f"interaction {interaction_id} not recorded in {timeout_s:.0f} s"
        time.sleep(0.2)


def test_every_answer_says_what_strop_added_and_metrics_count_it(fleet, api_servers, settings, mock_upstream, tmp_path):
    # A metrics folder of its own: other servers of this session have counted completions too.
    api = _api(api_servers, settings, mock_upstream, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"))
    client = _client(api, fleet("oh"))
    # Counted from here, so a reused server's earlier completions do not count either.
    before = _overhead_counts(api.url)
    raw = client.completions.with_raw_response.create(model="tab", prompt="def f():", max_tokens=3)
    whole = raw.parse()
    assert float(raw.headers["x-strop-overhead-ms"]) >= 0
    assert whole.choices[0].text == "".join(TOKENS[:3])
    assert _recorded(whole.id).completion == whole.choices[0].text
    with client.completions.with_streaming_response.create(
        model="tab", prompt="def f():", max_tokens=3, stream=True
    ) as streamed:
        assert float(streamed.headers["x-strop-overhead-ms"]) >= 0
        text = "".join(chunk.choices[0].text for chunk in streamed.parse())
    assert text == "".join(TOKENS[:3])
    after = _overhead_counts(api.url)
    added = {series: count - before.get(series, 0.0) for series, count in after.items()}
    assert {series: count for series, count in added.items() if count} == {
        'endpoint="CompletionApi",streamed="false"': 1.0,
        'endpoint="CompletionApi",streamed="true"': 1.0,
    }


def _overhead_counts(url: str) -> dict[str, float]:
    """The overhead histogram's count per series (endpoint, streamed), as /metrics shows it now."""
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("strop_serving_overhead_seconds_count{")
    }


def test_a_client_that_leaves_mid_stream_has_what_it_was_served_recorded(fleet, api_servers, settings, mock_upstream):
    api = _api(api_servers, settings, mock_upstream)
    stream = _client(api, fleet("leave")).completions.create(
        model="tab", prompt="def f():", max_tokens=400, stream=True
    )  # 400 tokens at 50 ms: 20 s, left after three
    received = []
    for chunk in stream:
        received.append(chunk.choices[0].text)
        if len(received) == 3:
            break
    stream.close()
    recorded = _recorded(chunk.id)
    served = len(recorded.completion_token_ids)
    assert 3 <= served < 400  # what reached the client, and what was on its way when it left; never the rest
    assert recorded.completion == "".join(TOKENS[:served]) and recorded.completion.startswith("".join(received))
    assert recorded.completion_token_ids == list(range(1000, 1000 + served))


def _worker_pids(master_pid: int) -> list[int]:
    children = open(f"/proc/{master_pid}/task/{master_pid}/children").read().split()
    return [int(pid) for pid in children]


def test_a_worker_stopped_mid_stream_serves_it_to_the_end_and_records_it(fleet, api_servers, settings, mock_upstream):
    """SIGTERM (a deploy, a restart): the worker takes no new connection and finishes its streams
    (gunicorn's graceful_timeout) before it exits; nothing served is lost, nothing is cut."""
    api = _api(api_servers, settings, mock_upstream)
    (worker,) = _worker_pids(api.proc.pid)
    stream = _client(api, fleet("term")).completions.create(model="tab", prompt="def f():", max_tokens=40, stream=True)
    texts = []
    for chunk in stream:
        texts.append(chunk.choices[0].text)
        if len(texts) == 2:
            os.kill(worker, signal.SIGTERM)
    assert "".join(texts) == "".join(TOKENS[:40])
    recorded = _recorded(chunk.id, tokens=40)
    assert recorded.completion == "".join(TOKENS[:40])


def _native_modules(pid: int) -> str:
    """The shared objects a process has mapped (which of uvloop's and httptools' it loaded)."""
    return open(f"/proc/{pid}/maps").read()


def test_workers_run_on_uvloop_and_httptools_unless_told_otherwise(fleet, api_servers, settings, mock_upstream):
    """uvicorn's native event loop and HTTP parser by default (``STROP_API_LOOP`` / ``STROP_API_HTTP``
    name the pure-Python ones); either way the openai client is served the same answer."""
    key = fleet("loops")
    texts = {}
    for name, env in (("native", {}), ("pure", {"STROP_API_LOOP": "asyncio", "STROP_API_HTTP": "h11"})):
        api = _api(api_servers, settings, mock_upstream, **env)
        texts[name] = _client(api, key).completions.create(model="tab", prompt="def f():", max_tokens=3).choices[0].text
        (worker,) = _worker_pids(api.proc.pid)
        mapped = _native_modules(worker)
        native = "uvloop/loop." in mapped and "httptools/parser/parser." in mapped
        assert native == (name == "native"), f"{name}: uvloop and httptools loaded: {native}"
    assert texts == {"native": "".join(TOKENS[:3]), "pure": "".join(TOKENS[:3])}


def _parts_hold(interaction_id: str, *, at_least: int, timeout_s: float = 60.0) -> int:
    """How many tokens the stream's parts hold once they hold ``at_least``."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = sum(len(ids) for ids in StreamPart.objects.filter(interaction_id=interaction_id).values_list(
            "completion_token_ids", flat=True
        ))  # fmt: skip
        if held >= at_least:
            return held
        assert time.monotonic() < deadline, f"no parts of {interaction_id} with {at_least} tokens in {timeout_s:.0f} s"
        time.sleep(0.05)


def _feedback(api, key: str, interaction_id: str) -> httpx.Response:
    return httpx.post(
        f"{api.url}/v1/feedback",
        json={"interaction_id": interaction_id, "outcome": "accepted"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def test_a_worker_killed_mid_stream_loses_only_what_it_served_after_its_last_write(
    fleet, api_servers, settings, mock_upstream
):
    """SIGKILL (the OOM killer, a crash): nothing of the worker runs again, yet what it had written of
    the stream is recorded by the sweeper as a partial interaction, and the feedback sent while it
    ran applies to it."""
    api = _api(api_servers, settings, mock_upstream)
    (worker,) = _worker_pids(api.proc.pid)
    key = fleet("kill", scopes=("serve", "feedback"))
    stream = _client(api, key).completions.create(model="tab", prompt="def f():", max_tokens=400, stream=True)
    reading = iter(stream)  # 400 tokens at 50 ms: 20 s
    chunks = [next(reading) for _ in range(4)]
    written = _parts_hold(chunks[0].id, at_least=len(chunks))  # the kill waits for a write: none of it is luck
    pending = _feedback(api, key, chunks[0].id)
    assert pending.status_code == 202, pending.text  # kept as pending while the stream is open
    os.kill(worker, signal.SIGKILL)
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in reading:  # the connection dies with the worker
            pass
    assert not Interaction.objects.filter(pk=chunks[0].id).exists()  # open: nothing half-written is an interaction
    assert stream_parts_sweep(now=timezone.now() + timedelta(seconds=settings.STROP_SERVING_STALE_STREAM_S + 1)) == 1
    recorded = Interaction.objects.get(pk=chunks[0].id)
    served = len(recorded.completion_token_ids)
    assert written <= served < 400  # never less than a write it had made; never the rest
    assert recorded.completion == "".join(TOKENS[:served])
    assert recorded.completion_token_ids == list(range(1000, 1000 + served))
    assert len(recorded.completion_logprobs) == served
    assert recorded.metadata["partial"] is True and recorded.metadata["finish_reason"] is None
    assert [f.outcome for f in recorded.feedback.all()] == ["accepted"]
    assert not StreamPart.objects.filter(interaction_id=chunks[0].id).exists()


def test_feedback_sent_while_a_stream_runs_applies_to_its_one_interaction(fleet, api_servers, settings, mock_upstream):
    api = _api(api_servers, settings, mock_upstream)
    key = fleet("live", scopes=("serve", "feedback"))
    stream = _client(api, key).completions.create(model="tab", prompt="def f():", max_tokens=60, stream=True)
    texts = []
    for chunk in stream:
        texts.append(chunk.choices[0].text)
        if len(texts) == 2:
            _parts_hold(chunk.id, at_least=2)  # written while the stream runs
            assert _feedback(api, key, chunk.id).status_code == 202
    assert "".join(texts) == "".join(TOKENS[:60])
    recorded = _recorded(chunk.id, tokens=60)
    assert recorded.completion == "".join(TOKENS[:60]) and recorded.metadata["finish_reason"] == "length"
    assert "partial" not in recorded.metadata
    assert Interaction.objects.filter(tenant_id=recorded.tenant_id).count() == 1
    deadline = time.monotonic() + 30  # attached in the transaction that recorded it
    while not recorded.feedback.exists():
        assert time.monotonic() < deadline, "the feedback sent during the stream was not attached"
        time.sleep(0.1)
    assert [f.outcome for f in recorded.feedback.all()] == ["accepted"]
    assert not StreamPart.objects.filter(interaction_id=chunk.id).exists()


def test_a_stream_upstream_fails_after_a_write_is_a_failure_and_keeps_its_feedback(
    fleet, api_servers, settings, mock_upstream
):
    api = _api(api_servers, settings, mock_upstream)
    key = fleet("fail", scopes=("serve", "feedback"))
    stream = _client(api, key).completions.create(model="tab", prompt="def f():", max_tokens=400, stream=True)
    reading = iter(stream)
    first = next(reading)
    _parts_hold(first.id, at_least=1)
    assert _feedback(api, key, first.id).status_code == 202
    tenant_id = StreamPart.objects.filter(interaction_id=first.id).values_list("tenant_id", flat=True).first()
    os.killpg(mock_upstream.proc.pid, signal.SIGKILL)  # vLLM gone mid-stream
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in reading:
            pass
    deadline = time.monotonic() + 30
    while not ServingFailure.objects.filter(tenant_id=tenant_id, streamed=True).exists():
        assert time.monotonic() < deadline, "the failed stream was not recorded as a failure"
        time.sleep(0.1)
    assert not Interaction.objects.filter(pk=first.id).exists()  # a failure, never half an interaction
    assert not StreamPart.objects.filter(interaction_id=first.id).exists()  # nor later, by the sweeper
    assert [f.outcome for f in Feedback.objects.filter(tenant_id=tenant_id, pending_client_id=first.id)] == [
        "accepted"
    ]  # kept, never deleted


def test_a_tenant_past_its_streams_gets_429_and_a_full_process_503(fleet, api_servers, settings, mock_upstream):
    api = _api(
        api_servers, settings, mock_upstream, STROP_SERVING_MAX_STREAMS_PER_TENANT="2", STROP_SERVING_MAX_IN_FLIGHT="3"
    )
    greedy, other = _client(api, fleet("greedy")), _client(api, fleet("other"))

    def hold(client: openai.OpenAI):
        stream = client.completions.create(model="tab", prompt="x", max_tokens=400, stream=True)
        next(iter(stream))  # answered and streaming: it holds its slot until closed
        return stream

    held = [hold(greedy), hold(greedy)]
    with pytest.raises(openai.RateLimitError) as refused:
        greedy.completions.create(model="tab", prompt="x", max_tokens=4, stream=True)
    assert refused.value.code == "too_many_streams" and refused.value.response.headers["retry-after"] == "1"
    assert float(refused.value.response.headers["x-strop-overhead-ms"]) >= 0
    held.append(hold(other))  # another tenant's stream: the process's third and last
    with pytest.raises(openai.InternalServerError) as busy:
        other.completions.create(model="tab", prompt="x", max_tokens=4)
    assert busy.value.status_code == 503 and busy.value.code == "server_busy"
    assert busy.value.response.headers["retry-after"] == "1"
    assert float(busy.value.response.headers["x-strop-overhead-ms"]) >= 0
    held.pop(0).close()
    deadline = time.monotonic() + 60
    while True:  # the closed stream's slot and lease come back once the server has seen it go
        try:
            text = "".join(
                c.choices[0].text for c in greedy.completions.create(model="tab", prompt="x", max_tokens=2, stream=True)
            )
            break
        except (openai.RateLimitError, openai.InternalServerError):
            assert time.monotonic() < deadline, "the closed stream's slot never came back"
            time.sleep(0.2)
    assert text == "".join(TOKENS[:2])
    for stream in held:
        stream.close()
