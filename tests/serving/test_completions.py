"""The completion endpoint against the real vLLM server (CPU build) and the tiny starter model."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from apps.adapters.loading import adapter_version_load
from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_create, adapter_version_promote, adapter_version_register
from apps.common.exceptions import Conflict
from apps.engines.vllm import vllm_client
from apps.interactions.models import Interaction, ServingFailure

pytestmark = [pytest.mark.vllm, pytest.mark.django_db]

PROMPT = "def parse(line):\n    "


def complete(client, **body):
    return client.post("/v1/completions", {"max_tokens": 8, "seed": 7, **body}, format="json")


def test_completion_through_strop_returns_vllms_tokens_and_records_them(serve_client, serving_adapter, served):
    response = complete(serve_client, prompt=PROMPT)
    assert response.status_code == 200, response.json()
    body = response.json()
    direct = vllm_client().complete(model=served.served_model_name, prompt=PROMPT, max_tokens=8, seed=7)
    assert body["choices"][0]["text"] == direct.choice.text
    assert body["object"] == "text_completion" and body["model"] == "autocomplete"
    interaction = Interaction.objects.get(pk=body["id"])
    assert interaction.source == "served" and interaction.adapter_version is None
    assert interaction.completion_token_ids == direct.choice.token_ids
    assert interaction.completion_logprobs == pytest.approx(direct.choice.logprobs, abs=1e-4)
    assert interaction.prompt_token_ids == direct.prompt_token_ids
    assert interaction.latency_ms > 0 and interaction.prompt == PROMPT


def test_feedback_can_name_the_served_completion(serve_client, serving_adapter):
    interaction_id = complete(serve_client, prompt=PROMPT).json()["id"]
    response = serve_client.post(
        "/v1/feedback", {"interaction_id": interaction_id, "outcome": "accepted"}, format="json"
    )
    assert response.status_code == 200


def test_prefix_and_suffix_become_the_base_models_fim_prompt(serve_client, serving_adapter, served):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(served.model_dir)
    response = complete(serve_client, prefix="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n")
    assert response.status_code == 200, response.content
    body = response.json()
    interaction = Interaction.objects.get(pk=body["id"])
    assert interaction.prompt_token_ids[0] == tokenizer.convert_tokens_to_ids("<|fim_prefix|>")
    assert tokenizer.convert_tokens_to_ids("<|fim_middle|>") == interaction.prompt_token_ids[-1]
    assert (interaction.prefix, interaction.suffix) == ("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n")


def test_a_fim_prompt_with_a_suffix_beside_it_is_refused_not_dropped(serve_client, serving_adapter):
    both = complete(serve_client, prompt="<fim_prefix>a<fim_suffix>b<fim_middle>", suffix="c")
    assert both.status_code == 400 and both.json()["error"]["param"] == "suffix"


def test_n_choices_are_recorded_as_one_interaction_each(serve_client, serving_adapter):
    body = complete(serve_client, prompt=PROMPT, n=3).json()
    ids = [choice["interaction_id"] for choice in body["choices"]]
    assert body["id"] == ids[0] and len(set(ids)) == 3
    assert Interaction.objects.filter(pk__in=ids).count() == 3
    for row in Interaction.objects.filter(pk__in=ids):  # ids sort by served time (apps.interactions.ids)
        made = int.from_bytes(row.pk.bytes[:6], "big") / 1000
        assert row.pk.version == 7 and abs(made - row.served_at.timestamp()) < 5


def test_routing_follows_the_production_pointer(serving_tenant, serve_client, serving_adapter, loaded_version, served):
    v1 = loaded_version(seed=11)
    adapter_version_promote(serving_tenant, version=v1, actor="test")
    first = complete(serve_client, prompt=PROMPT).json()
    assert first["strop"]["version"] == v1.vllm_name
    direct = vllm_client().complete(model=v1.vllm_name, prompt=PROMPT, max_tokens=8, seed=7)
    assert Interaction.objects.get(pk=first["id"]).completion_token_ids == direct.choice.token_ids

    v2 = loaded_version(seed=12, parent=v1)
    adapter_version_promote(serving_tenant, version=v2, actor="test")
    second = complete(serve_client, prompt=PROMPT).json()
    assert Interaction.objects.get(pk=second["id"]).adapter_version_id == v2.pk


def test_a_version_vllm_no_longer_has_is_loaded_on_demand(
    serving_tenant, serve_client, serving_adapter, make_lora_adapter, served
):
    version = adapter_version_register(
        serving_tenant, adapter=serving_adapter, source_dir=make_lora_adapter(seed=13), enqueue_load=False
    )
    AdapterVersion.objects.filter(pk=version.pk).update(loaded_at="2026-11-21T00:00:00Z")  # as if vLLM restarted
    version.refresh_from_db()
    adapter_version_promote(serving_tenant, version=version, actor="test")
    assert version.vllm_name not in {m.id for m in vllm_client().models()}
    response = complete(serve_client, prompt=PROMPT)
    assert response.status_code == 200
    assert version.vllm_name in {m.id for m in vllm_client().models()}


def test_a_version_vllm_refuses_is_marked_failed_and_never_routed(
    settings, serving_tenant, serving_adapter, make_lora_adapter, served
):
    settings.VLLM_MAX_LORA_RANK = 64  # our check lets it through; the server (rank <= 16) refuses it
    version = adapter_version_register(
        serving_tenant, adapter=serving_adapter, source_dir=make_lora_adapter(seed=14, rank=32), enqueue_load=False
    )
    assert adapter_version_load(version_id=version.pk) == "failed"
    version.refresh_from_db()
    assert version.status == "failed" and "rank" in version.status_message.lower()
    with pytest.raises(Conflict):
        adapter_version_promote(serving_tenant, version=version, actor="test")


def test_another_tenants_adapter_name_is_404(serve_client, serving_adapter, make_tenant, base_model):
    other = make_tenant("other-tenant")
    adapter_create(other, name="secret-adapter", base_model=base_model)
    response = complete(serve_client, prompt=PROMPT, model="secret-adapter")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"n": 0}, "n"),
        ({"temperature": 5}, "temperature"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"prefix": "x"}, "prompt"),
        ({"stop": [1]}, "stop"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"12": 101}}, "logit_bias"),
        ({"logprobs": 25}, "logprobs"),
        ({"n": 2, "best_of": 1}, "best_of"),
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"stream_options": {"include_everything": True}}, "stream_options"),
        ({"seed": 2**70}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["x"] * 65}, "stop"),
        ({"suffixx": "typo"}, "suffixx"),
    ],
)
def test_bad_completion_input_is_400_naming_the_field(serve_client, serving_adapter, patch, field):
    response = complete(serve_client, prompt=PROMPT, **patch)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(field)


def test_streaming_sends_openai_events_and_records_the_same_tokens(serve_client, serving_adapter):
    whole = complete(serve_client, prompt=PROMPT, temperature=0).json()
    response = complete(serve_client, prompt=PROMPT, temperature=0, stream=True)
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    raw = b"".join(response.streaming_content).decode()
    events = [line[len("data: ") :] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole["choices"][0]["text"]
    streamed = Interaction.objects.get(pk=chunks[0]["id"])
    assert streamed.completion_token_ids == Interaction.objects.get(pk=whole["id"]).completion_token_ids


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_vllm_down_is_a_quick_503_with_retry_after(settings, serve_client, serving_adapter):
    settings.VLLM_BASE_URLS = [f"http://127.0.0.1:{_closed_port()}"]
    started = time.monotonic()
    response = complete(serve_client, prompt=PROMPT)
    assert time.monotonic() - started < 5
    assert response.status_code == 503 and int(response["Retry-After"]) > 0
    assert response.json()["error"]["code"] == "vllm_unavailable"
    assert not Interaction.objects.exists()  # nothing was served: no interaction, half or whole
    failure = ServingFailure.objects.get()
    assert failure.kind == "vllm_unavailable" and failure.adapter == serving_adapter and not failure.streamed


@pytest.mark.django_db(transaction=True)
def test_swapping_production_under_traffic_fails_no_request(
    live_server, serving_tenant, serve_client, serving_adapter, loaded_version
):
    v1 = loaded_version(seed=21)
    adapter_version_promote(serving_tenant, version=v1, actor="test")
    failures: list[str] = []
    versions: dict[int, list[str]] = {n: [] for n in range(3)}  # per client, in the order answered
    stop = threading.Event()

    def traffic(n: int) -> None:
        headers = {"Authorization": f"Bearer {serve_client.raw_key}"}
        with httpx.Client(base_url=live_server.url, headers=headers, timeout=60) as http:
            while not stop.is_set():
                response = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text[:200]}")
                else:
                    versions[n].append(response.json()["strop"]["version"])

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + 120
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {versions}"
            time.sleep(0.1)

    threads = [threading.Thread(target=traffic, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: all(versions[n] for n in versions), "every client to be served by v1")
        v2 = loaded_version(seed=22, parent=v1)  # registered and loaded while traffic flows
        adapter_version_promote(serving_tenant, version=v2, actor="test")
        # A request resolves its version once, at its start: each client's next request is v2's.
        wait_for(lambda: all(versions[n] and versions[n][-1] == v2.vllm_name for n in versions), "v2 everywhere")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert failures == []
    for answered in versions.values():
        assert answered[0] == v1.vllm_name and answered[-1] == v2.vllm_name
        switched = answered.index(v2.vllm_name)
        assert set(answered[switched:]) == {v2.vllm_name}  # never back to v1 once v2 answered


def test_promoting_a_version_vllm_does_not_hold_loads_it_first(
    serving_tenant, make_client, serving_adapter, make_lora_adapter, served
):
    admin = make_client(serving_tenant, scopes=["admin"])
    version = adapter_version_register(
        serving_tenant, adapter=serving_adapter, source_dir=make_lora_adapter(seed=41), enqueue_load=False
    )
    response = admin.post(f"/v1/adapters/autocomplete/versions/{version.number}/promote")
    assert response.status_code == 200 and response.json()["production_version"] == version.number
    assert version.vllm_name in {m.id for m in vllm_client().models()}


def test_a_plugins_fim_prompt_in_another_convention_is_rebuilt_for_the_base_model(
    serve_client, serving_adapter, served
):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(served.model_dir)
    continue_prompt = "<fim_prefix># Path: a.py\ndef add(a, b):\n    <fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>"
    response = complete(serve_client, prompt=continue_prompt, max_tokens=4096, stop=["\n\n", "<fim_prefix>"] * 6)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["strop"]["fim"] == {"convention": "starcoder", "suffix_shown_to_model": True}
    assert body["strop"]["max_tokens"] == serving_adapter.max_completion_tokens
    interaction = Interaction.objects.get(pk=body["id"])
    assert (interaction.prefix, interaction.suffix) == ("# Path: a.py\ndef add(a, b):\n    ", "\n\nprint(add(1, 2))\n")
    assert interaction.prompt == continue_prompt
    assert interaction.prompt_token_ids[0] == tokenizer.convert_tokens_to_ids("<|fim_prefix|>")
    assert interaction.prompt_token_ids[-1] == tokenizer.convert_tokens_to_ids("<|fim_middle|>")
    assert "<fim_prefix>" not in tokenizer.decode(interaction.prompt_token_ids)
