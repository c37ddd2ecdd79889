"""vLLM's prefix cache is salted per tenant: each request carries its tenant's ``cache_salt``, the
same for every request of a tenant, different between tenants, not the tenant's id, and one vLLM
takes (the real server answering through Strop is tests/serving/test_completions.py)."""

from __future__ import annotations

from types import SimpleNamespace

from apps.serving.chat import _vllm_body
from apps.serving.completion_requests import tenant_cache_salt, vllm_kwargs


def test_each_tenant_has_a_salt_of_its_own_that_vllm_takes(settings):
    salts = {tenant_id: tenant_cache_salt(tenant_id) for tenant_id in (1, 2, 3)}
    assert len(set(salts.values())) == 3 and tenant_cache_salt(2) == salts[2]
    for salt in salts.values():
        assert 1 <= len(salt) <= 128 and not set(salt) & {"@", "/", "\\", "\x00"} and "1" != salt
    settings.SECRET_KEY = "another-secret-key-" * 4
    assert tenant_cache_salt(1) != salts[1]  # keyed: not derivable from the id alone


def test_completions_and_chat_send_it(settings):
    route = SimpleNamespace(vllm_model="t--tab--v1", adapter=SimpleNamespace(tenant_id=7))
    completion = SimpleNamespace(
        sampling={}, prompt="x = ", is_fim=False, max_tokens=4, temperature=1.0, top_p=1.0, stop=[], n=1, seed=None,
        user="", logprobs=1,
    )  # fmt: skip
    assert vllm_kwargs(route, completion)["extra"]["cache_salt"] == tenant_cache_salt(7)
    chat = SimpleNamespace(
        sampling={}, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=1.0, top_p=1.0, n=1,
        top_logprobs=0, tools=None, tool_choice=None, stop=None, seed=None, user="",
    )  # fmt: skip
    assert _vllm_body(route, chat)["cache_salt"] == tenant_cache_salt(7)
