"""The vLLM client against the real vLLM server (CPU build) on the tiny starter model."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from apps.common.exceptions import ServiceUnavailable
from apps.engines.vllm_client import (
    AdapterConflict,
    AdapterRejected,
    ModelNotLoaded,
    VLLMBadRequest,
    VLLMClient,
    VLLMError,
    VLLMUnavailable,
    merge_chunks,
)
from tests.fixtures.vllm import VLLMServer

pytestmark = pytest.mark.vllm

PROMPT = "def parse(line):\n    "


@pytest.fixture
def client(vllm_server: VLLMServer) -> VLLMClient:
    return VLLMClient([vllm_server.base_url], timeout=60.0)


@pytest.fixture
def base(vllm_server: VLLMServer) -> str:
    return vllm_server.served_model_name


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed on exit: nothing listens there


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A socket that accepts connections (backlog) but never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


# ------------------------------------------------------------------ completions


def test_completion_returns_one_logprob_per_sampled_token_id(client: VLLMClient, base: str) -> None:
    completion = client.complete(model=base, prompt=PROMPT, max_tokens=16, seed=1)

    choice = completion.choice
    assert len(choice.token_ids) == len(choice.logprobs) == completion.usage.completion_tokens  # type: ignore[union-attr]
    assert 1 <= len(choice.token_ids) <= 16
    assert all(lp <= 0.0 for lp in choice.logprobs)
    assert completion.prompt_token_ids and len(completion.prompt_token_ids) == completion.usage.prompt_tokens  # type: ignore[union-attr]
    assert choice.finish_reason in {"stop", "length"}


def test_prompt_given_as_token_ids_is_served_as_given(client: VLLMClient, base: str) -> None:
    prompt_ids = client.complete(model=base, prompt=PROMPT, max_tokens=1).prompt_token_ids
    assert prompt_ids

    completion = client.complete(model=base, prompt=prompt_ids, max_tokens=4, temperature=0)

    from_text = client.complete(model=base, prompt=PROMPT, max_tokens=4, temperature=0)
    assert completion.prompt_token_ids == prompt_ids
    assert completion.choice.token_ids == from_text.choice.token_ids


def test_same_seed_gives_same_tokens_and_another_seed_other_tokens(client: VLLMClient, base: str) -> None:
    first = client.complete(model=base, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=42).choice
    again = client.complete(model=base, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=42).choice
    other = client.complete(model=base, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=43).choice

    assert again.token_ids == first.token_ids
    assert again.logprobs == pytest.approx(first.logprobs, abs=1e-5)
    assert other.token_ids != first.token_ids


def test_n_choices_each_carry_their_own_tokens(client: VLLMClient, base: str) -> None:
    completion = client.complete(model=base, prompt=PROMPT, max_tokens=6, n=3, seed=7)

    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert all(len(c.token_ids) == len(c.logprobs) for c in completion.choices)
    assert len({tuple(c.token_ids) for c in completion.choices}) > 1


def test_streamed_chunks_join_to_the_non_streamed_completion(client: VLLMClient, base: str) -> None:
    kwargs = {"model": base, "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0, "seed": 5}
    whole = client.complete(**kwargs)  # type: ignore[arg-type]

    chunks = list(client.stream(**kwargs))  # type: ignore[arg-type]
    joined = merge_chunks(chunks)

    assert len(chunks) > 2  # really streamed, token by token
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == whole.choice.text
    assert joined.choice.token_ids == whole.choice.token_ids
    assert joined.choice.logprobs == pytest.approx(whole.choice.logprobs, abs=1e-4)
    assert joined.choice.finish_reason == whole.choice.finish_reason
    assert joined.prompt_token_ids == whole.prompt_token_ids
    assert joined.usage == whole.usage


def test_eos_first_is_an_empty_text_whose_token_ids_hold_the_eos(
    client: VLLMClient, base: str, vllm_server: VLLMServer
) -> None:
    eos_id = json.loads((vllm_server.model_dir / "config.json").read_text())["eos_token_id"]

    completion = client.complete(model=base, prompt=PROMPT, max_tokens=8, extra={"logit_bias": {str(eos_id): 100}})

    assert completion.choice.text == ""
    assert completion.choice.token_ids == [eos_id]
    assert len(completion.choice.logprobs) == 1
    assert completion.choice.finish_reason == "stop"


def test_too_many_tokens_is_a_bad_request_carrying_vllms_message(client: VLLMClient, base: str) -> None:
    with pytest.raises(VLLMBadRequest) as caught:
        client.complete(model=base, prompt=PROMPT, max_tokens=100_000)

    assert "max_tokens" in caught.value.message
    assert caught.value.status_code == 400


def test_unknown_model_is_model_not_loaded(client: VLLMClient) -> None:
    with pytest.raises(ModelNotLoaded) as caught:
        client.complete(model="no-such-adapter", prompt=PROMPT)

    assert "no-such-adapter" in caught.value.message


# ------------------------------------------------------------------ adapters


def test_loaded_adapter_is_listed_and_changes_the_output(
    client: VLLMClient, base: str, make_lora_adapter: Callable[..., Path]
) -> None:
    adapter = make_lora_adapter(seed=1)

    client.load_adapter("t1-a1-v1", adapter)

    card = next(m for m in client.models() if m.id == "t1-a1-v1")
    assert (card.root, card.parent) == (str(adapter), base)
    with_adapter = client.complete(model="t1-a1-v1", prompt=PROMPT, max_tokens=8, temperature=0)
    without = client.complete(model=base, prompt=PROMPT, max_tokens=8, temperature=0)
    assert with_adapter.choice.token_ids != without.choice.token_ids
    assert with_adapter.choice.logprobs != pytest.approx(without.choice.logprobs, abs=1e-3)


def test_loading_on_every_replica_is_idempotent_for_the_same_path(
    vllm_server: VLLMServer, make_lora_adapter: Callable[..., Path]
) -> None:
    # The same server listed twice stands in for two replicas: the second load finds the name.
    two = VLLMClient([vllm_server.base_url, vllm_server.base_url + "/"])
    adapter = make_lora_adapter(seed=2)

    two.load_adapter("t1-a1-v2", adapter)
    two.load_adapter("t1-a1-v2", adapter)

    assert [m.id for m in two.models()].count("t1-a1-v2") == 1


def test_loading_a_name_already_used_for_another_path_is_a_conflict(
    client: VLLMClient, make_lora_adapter: Callable[..., Path]
) -> None:
    client.load_adapter("t1-a1-v3", make_lora_adapter(seed=3))

    with pytest.raises(AdapterConflict):
        client.load_adapter("t1-a1-v3", make_lora_adapter(seed=4))


def test_bad_adapter_path_is_rejected_with_vllms_message(client: VLLMClient, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"

    with pytest.raises(AdapterRejected) as caught:
        client.load_adapter("t1-a1-missing", missing)

    assert "No adapter found" in caught.value.message  # vLLM's own words (it redacts paths)
    assert caught.value.vllm_status == 404
    assert caught.value.details["lora_path"] == str(missing)
    assert "t1-a1-missing" not in [m.id for m in client.models()]


def test_adapter_above_the_rank_limit_is_rejected_and_the_server_stays_up(
    client: VLLMClient, vllm_server: VLLMServer, make_lora_adapter: Callable[..., Path]
) -> None:
    too_big = make_lora_adapter(seed=5, rank=vllm_server.max_lora_rank * 2)

    with pytest.raises(AdapterRejected) as caught:
        client.load_adapter("t1-a1-big", too_big)

    assert "max_lora_rank" in caught.value.message
    assert client.health() == {vllm_server.base_url: True}


def test_adapter_with_nan_weights_loads_but_its_completions_fail_as_server_errors(
    client: VLLMClient, make_lora_adapter: Callable[..., Path]
) -> None:
    # vLLM does not check weights: the trainer must refuse to write such an adapter.
    import torch
    from safetensors.torch import load_file, save_file

    adapter = make_lora_adapter(seed=7)
    weights_file = adapter / "adapter_model.safetensors"
    weights = load_file(weights_file)
    save_file({k: torch.full_like(v, float("nan")) for k, v in weights.items()}, weights_file)
    client.load_adapter("t1-a1-nan", adapter)

    with pytest.raises(VLLMError) as caught:
        client.complete(model="t1-a1-nan", prompt=PROMPT, max_tokens=2)

    assert not isinstance(caught.value, VLLMBadRequest)  # not the tenant's fault
    assert caught.value.status_code == 502


def test_unload_removes_the_adapter_and_is_idempotent(
    client: VLLMClient, make_lora_adapter: Callable[..., Path]
) -> None:
    client.load_adapter("t1-a1-gone", make_lora_adapter(seed=6))

    client.unload_adapter("t1-a1-gone")
    client.unload_adapter("t1-a1-gone")

    assert "t1-a1-gone" not in [m.id for m in client.models()]
    with pytest.raises(ModelNotLoaded):
        client.complete(model="t1-a1-gone", prompt=PROMPT)


# ------------------------------------------------------------------ replicas and failures


def test_replica_not_listening_gives_service_unavailable_at_once(base: str) -> None:
    dead = VLLMClient([f"http://127.0.0.1:{_closed_port()}"])

    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as caught:
        dead.complete(model=base, prompt=PROMPT)

    assert time.monotonic() - started < 2.0
    assert caught.value.status_code == 503 and caught.value.retry_after_s > 0
    assert dead.health() == {dead.base_urls[0]: False}


def test_completion_fails_over_from_a_replica_that_refuses_connections(vllm_server: VLLMServer, base: str) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    pair = VLLMClient([dead, vllm_server.base_url])

    served_by = {pair.complete(model=base, prompt=PROMPT, max_tokens=2).replica for _ in range(4)}

    assert served_by == {vllm_server.base_url}


def test_replica_that_never_answers_times_out_and_is_not_retried_elsewhere(
    silent_server: str, vllm_server: VLLMServer, base: str
) -> None:
    # The request reached the silent replica, so retrying it on the live one would be blind.
    pair = VLLMClient([silent_server, vllm_server.base_url], timeout=0.5)

    started = time.monotonic()
    with pytest.raises(VLLMUnavailable) as caught:
        pair.complete(model=base, prompt=PROMPT)

    assert time.monotonic() - started < 3.0
    assert caught.value.replica == silent_server


def test_error_bodies_that_are_not_vllms_json_still_become_typed_errors() -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers["Content-Length"]))
            status = 404 if "wrong" in self.path else 500
            body = b"<html>upstream exploded</html>" if "html" in self.path else json.dumps({"detail": "odd"}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(VLLMError) as caught:
            VLLMClient([url]).complete(model="m", prompt="x")
        assert "odd" in caught.value.message and caught.value.vllm_status == 500
        with pytest.raises(VLLMError) as caught:
            VLLMClient([url + "/html"]).complete(model="m", prompt="x")
        assert "upstream exploded" in caught.value.message
        with pytest.raises(VLLMError) as caught:  # a 404 without vLLM's error JSON: a wrong URL
            VLLMClient([url + "/wrong"]).complete(model="m", prompt="x")
        assert not isinstance(caught.value, ModelNotLoaded)
    finally:
        server.shutdown()
        server.server_close()


def test_a_tenant_stays_on_its_home_replica_and_fails_over_when_it_refuses(vllm_server: VLLMServer, base: str) -> None:
    # One server under two names stands in for two replicas.
    port = vllm_server.base_url.rsplit(":", 1)[1]
    replicas = [f"http://127.0.0.1:{port}", f"http://localhost:{port}"]
    pair = VLLMClient(replicas)
    homes = {f"tenant-{n}": pair._order(f"tenant-{n}")[0] for n in range(40)}
    assert set(homes.values()) == set(replicas)  # both replicas are home to some tenants
    for tenant in ("tenant-1", "tenant-2"):
        served_by = {pair.complete(model=base, prompt=PROMPT, max_tokens=2, affinity=tenant).replica for _ in range(4)}
        assert served_by == {homes[tenant]}
    unpinned = {pair.complete(model=base, prompt=PROMPT, max_tokens=2).replica for _ in range(4)}
    assert unpinned == set(replicas)  # round-robin without an affinity

    dead = f"http://127.0.0.1:{_closed_port()}"
    with_dead_home = VLLMClient([dead, replicas[1]])
    tenant = next(f"tenant-{n}" for n in range(100) if with_dead_home._order(f"tenant-{n}")[0] == dead)
    assert with_dead_home.complete(model=base, prompt=PROMPT, max_tokens=2, affinity=tenant).replica == replicas[1]


def test_adding_a_replica_moves_only_the_tenants_it_takes() -> None:
    two = VLLMClient(["http://a:1", "http://b:1"])
    three = VLLMClient(["http://a:1", "http://b:1", "http://c:1"])
    tenants = [f"tenant-{n}" for n in range(300)]
    before = {t: two._order(t)[0] for t in tenants}
    after = {t: three._order(t)[0] for t in tenants}
    moved = [t for t in tenants if before[t] != after[t]]
    assert all(after[t] == "http://c:1" for t in moved)
    assert 60 < len(moved) < 140  # about a third
    assert all(three._order(t) == three._order(t) for t in tenants[:10])  # the same order every time


def test_the_connect_timeout_is_a_setting_both_clients_take(settings):
    import asyncio

    import httpx

    from apps.engines.vllm import vllm_async_client, vllm_client

    settings.VLLM_BASE_URLS = ["http://127.0.0.1:9"]  # nothing listens: a connection is refused at once
    settings.VLLM_CONNECT_TIMEOUT_S = 2.5
    for client in (vllm_client(), vllm_async_client()):
        timeouts = client._timeouts(read=30.0)
        assert (timeouts.connect, timeouts.pool, timeouts.read) == (2.5, 30.0, 30.0)
    settings.VLLM_CONNECT_TIMEOUT_S = 1.0
    assert vllm_client()._timeouts(read=5.0).connect == 1.0
    assert isinstance(asyncio.run(asyncio.sleep(0, result=httpx.Timeout(1.0))), httpx.Timeout)


def test_only_a_replica_with_another_after_it_gets_the_short_connect_deadline():
    """The short deadline is for failing over; the last replica to try gets LAST_CONNECT_S (5 s, or
    the answer's deadline if shorter), and a wait for a free connection in the process's own pool
    as long as the answer: a process busy with a burst of new streams must not read its own wait as
    a dead replica, and a host that answers nothing must not hold a request for the whole answer's
    deadline."""
    from apps.engines.vllm_client import VLLMClient

    two = VLLMClient(["http://a:1", "http://b:1"], connect_timeout=1.0, timeout=30.0)
    (first, early), (last, late) = two._attempts("tenant-1", 30.0)
    assert {first, last} == {"http://a:1", "http://b:1"}
    assert (early.connect, early.pool, early.read) == (1.0, 30.0, 30.0)
    assert (late.connect, late.pool, late.read) == (5.0, 30.0, 30.0)
    ((only, alone),) = VLLMClient("http://a:1", connect_timeout=1.0)._attempts(None, 3.0)
    assert (only, alone.connect, alone.pool) == ("http://a:1", 3.0, 3.0)
