"""What the completion and chat endpoints send vLLM of the client's sampling options."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from apps.serving.chat import _vllm_body
from apps.serving.completion_requests import vllm_kwargs

ROUTE = SimpleNamespace(vllm_model="t--tab--v1", adapter=SimpleNamespace(tenant_id=7))


@pytest.mark.parametrize("seed", [0, 7, -1])
def test_every_seed_reaches_vllm_zero_included(seed):
    chat = SimpleNamespace(
        sampling={}, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=1.0, top_p=1.0, n=1,
        top_logprobs=0, tools=None, tool_choice=None, stop=None, seed=seed, user="",
    )  # fmt: skip
    assert _vllm_body(ROUTE, chat)["seed"] == seed
    completion = SimpleNamespace(
        sampling={}, prompt="x = ", is_fim=False, max_tokens=4, temperature=1.0, top_p=1.0, stop=[], n=1, seed=seed,
        user="", logprobs=1,
    )  # fmt: skip
    assert vllm_kwargs(ROUTE, completion)["seed"] == seed


def test_no_seed_sends_none():
    chat = SimpleNamespace(
        sampling={}, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=1.0, top_p=1.0, n=1,
        top_logprobs=0, tools=None, tool_choice=None, stop=None, seed=None, user="",
    )  # fmt: skip
    assert "seed" not in _vllm_body(ROUTE, chat)
