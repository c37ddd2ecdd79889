"""The error object as the official ``openai`` client reads it (``.type``, ``.param``, ``.code``,
``.body``), against Strop's live server. Every error here is answered before vLLM is asked, so no
model server is needed."""

from __future__ import annotations

import openai
import pytest

from apps.adapters.models import BaseModel
from apps.adapters.services import adapter_create

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "def add(a, b):\n    "


@pytest.fixture
def base(db) -> BaseModel:
    return BaseModel.objects.create(name="base", path="/models/none", family=BaseModel.Family.QWEN)


@pytest.fixture
def tenant(make_tenant, base):
    tenant = make_tenant("acme")
    adapter_create(tenant, name="tab", base_model=base, is_default=True)
    adapter_create(tenant, name="chat", base_model=base)
    return tenant


@pytest.fixture
def client(live_server, tenant, make_client) -> openai.OpenAI:
    key = make_client(tenant).raw_key
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=key, max_retries=0, timeout=60)


def test_max_tokens_below_one_names_the_field_in_plain_words(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tab", prompt=PROMPT, max_tokens=-1)
    error = caught.value
    assert (error.type, error.param, error.code) == ("invalid_request_error", "max_tokens", "invalid")
    assert error.body["message"] == "max_tokens: must be at least 1 (got -1)"


@pytest.mark.parametrize("path", ["/completions", "/interactions"])
def test_an_unknown_field_is_the_same_code_on_every_endpoint(client, path):
    body = {"model": "tab", "prompt": PROMPT, "max_tokens": 2, "max_token": 3}
    if path == "/interactions":
        body = {"client_id": "c-1", "prompt": PROMPT, "completion": "return a + b", "max_token": 3}
    with pytest.raises(openai.BadRequestError) as caught:
        client.post(path, body=body, cast_to=object)
    error = caught.value
    assert (error.type, error.param, error.code) == ("invalid_request_error", "max_token", "unknown_field")
    assert error.body["message"].startswith("max_token: is not a known field")


def test_a_missing_message_content_names_its_path(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tab", messages=[{"role": "user"}], max_tokens=2)
    error = caught.value
    assert (error.type, error.param, error.code) == ("invalid_request_error", "messages.0.content", "required")


def test_an_unknown_model_lists_the_tenants_models_and_no_other_tenants(client, make_tenant, base):
    adapter_create(make_tenant("other"), name="secret", base_model=base)
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="tap", prompt=PROMPT, max_tokens=2)
    error = caught.value
    assert (error.type, error.param, error.code) == ("not_found_error", "model", "model_not_found")
    assert error.body["details"] == {"model": "tap", "models": ["chat", "tab"]}
    assert "this tenant's models: chat, tab" in error.body["message"] and "secret" not in str(error.body)


def test_the_base_model_by_name_is_refused_saying_to_name_an_adapter(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="base", prompt=PROMPT, max_tokens=2)
    error = caught.value
    assert (error.param, error.code) == ("model", "model_not_found")
    assert error.body["message"].startswith("model 'base' is a base model, not one of this tenant's models")
    assert error.body["details"]["models"] == ["chat", "tab"]


def test_a_bad_key_is_an_authentication_error(live_server, tenant):
    bad = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="strop_000000000000_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.models.list()
    error = caught.value
    assert (error.type, error.param, error.code) == ("authentication_error", None, "authentication_failed")


def test_over_the_rate_limit_is_a_rate_limit_error(client, tenant):
    tenant.rate_limit_per_minute = 1
    tenant.save(update_fields=["rate_limit_per_minute"])
    client.models.list()
    with pytest.raises(openai.RateLimitError) as caught:
        client.models.list()
    error = caught.value
    assert (error.type, error.param, error.code) == ("rate_limit_error", None, "rate_limited")
    assert int(error.response.headers["retry-after"]) >= 1


def test_a_bug_on_the_serving_path_is_a_500_in_openais_shape_that_says_what_strop_added(client, monkeypatch):
    from apps.serving import admission

    def broken() -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(admission, "process_slot_take", broken)
    with pytest.raises(openai.InternalServerError) as raised:
        client.completions.create(model="tab", prompt=PROMPT, max_tokens=4)
    assert raised.value.code == "server_error" and "request id" in raised.value.message
    assert float(raised.value.response.headers["X-Strop-Overhead-Ms"]) >= 0
