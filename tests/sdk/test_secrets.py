"""The API key never shows in a client's configuration or in an error's text, and a base URL that
would send it unencrypted across a network (plain http:// to a host other than this machine) warns."""

from __future__ import annotations

import warnings

import httpx
import pytest
from strop import (
    APIConnectionError,
    AsyncStrop,
    AuthenticationError,
    BadRequestError,
    InsecureBaseURLWarning,
    Strop,
    StropError,
)
from strop._core import ClientConfig
from strop._exceptions import error_from_response

from tests.sdk.conftest import closed_port

KEY = "strop_0123456789ab_S3cretPartOfTheKey-that_must_never_show"
SECRET = "S3cretPartOfTheKey-that_must_never_show"


def _build(base_url: str = "http://127.0.0.1:8000", **options) -> ClientConfig:
    return ClientConfig.build(base_url=base_url, api_key=KEY, timeout=None, max_retries=0, **options)


def test_the_config_repr_masks_the_key_and_credential_headers():
    config = _build(default_headers={"Proxy-Authorization": "Basic c2VjcmV0", "X-Team": "tools"})
    shown = repr(config)
    assert SECRET not in shown and "c2VjcmV0" not in shown
    assert "strop_0123456789ab_***" in shown and "'X-Team': 'tools'" in shown
    assert config.api_key == KEY  # masked in its repr only
    with Strop(api_key=KEY) as client:
        assert SECRET not in repr(client) and SECRET not in repr(vars(client))


def _answer(status: int, body: object, key: str = KEY) -> httpx.Response:
    request = httpx.Request("POST", "http://127.0.0.1:8000/v1/feedback", headers={"Authorization": f"Bearer {key}"})
    return httpx.Response(status, json=body, request=request)


def test_an_error_whose_answer_echoes_the_key_shows_it_masked():
    """A proxy (or a server) that quotes the Authorization header back: the text is masked."""
    error = error_from_response(_answer(401, {"error": {"code": "invalid", "message": f"bad key {KEY}"}}))
    assert isinstance(error, AuthenticationError)
    for text in (str(error), repr(error), error.message, repr(error.args)):
        assert SECRET not in text and "strop_0123456789ab_***" in text, text


def test_a_key_of_another_shape_sent_through_a_proxy_is_masked_too():
    odd = "proxy-token-0123456789abcdef"
    error = error_from_response(_answer(400, {"error": {"code": "invalid", "message": f"no: {odd}"}}, key=odd))
    assert isinstance(error, BadRequestError)
    assert odd not in str(error) and odd not in repr(error)


def test_a_connection_error_and_a_configuration_error_never_show_the_key():
    with Strop(base_url=f"http://127.0.0.1:{closed_port()}", api_key=KEY, max_retries=0) as client:
        with pytest.raises(APIConnectionError) as caught:
            client.tenant.get()
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    error = StropError(f"something about {KEY}")
    assert SECRET not in str(error) and SECRET not in repr(error)


def test_the_server_refusing_a_key_never_shows_it(api):
    wrong = api.key[: api.key.rindex("_") + 1] + "wrong-secret-wrong-secret"
    with Strop(base_url=api.url, api_key=wrong, max_retries=0) as client:
        with pytest.raises(AuthenticationError) as caught:
            client.tenant.get()
    assert "wrong-secret" not in str(caught.value) and "wrong-secret" not in repr(caught.value)


@pytest.mark.parametrize(
    "base_url", ["http://strop.example.com", "http://10.0.0.7:8000", "http://[2001:db8::1]:8000", "http://0.0.0.0:8000"]
)
def test_a_plain_http_base_url_to_another_host_warns(base_url: str):
    with pytest.warns(InsecureBaseURLWarning, match="unencrypted"):
        Strop(base_url=base_url, api_key=KEY).close()
    with pytest.warns(InsecureBaseURLWarning):
        AsyncStrop(base_url=base_url, api_key=KEY)


@pytest.mark.parametrize(
    "base_url",
    [
        "http://127.0.0.1:8000",
        "http://127.8.9.10",
        "http://localhost:8000",
        "http://LOCALHOST",
        "http://[::1]:8000",
        "https://strop.example.com",
    ],
)
def test_https_or_this_machine_does_not_warn(base_url: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Strop(base_url=base_url, api_key=KEY).close()


def test_the_warning_points_at_the_callers_line():
    with pytest.warns(InsecureBaseURLWarning) as caught:
        Strop(base_url="http://strop.example.com", api_key=KEY).close()
    assert caught[0].filename == __file__
