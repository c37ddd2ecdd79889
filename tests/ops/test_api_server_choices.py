"""The API workers' event loop and HTTP parser settings (config/uvicorn_worker.py)."""

from __future__ import annotations

import pytest

from config.uvicorn_worker import server_choices


def test_native_by_default_and_the_pure_python_ones_by_name():
    assert server_choices({}) == {"loop": "auto", "http": "auto"}
    assert server_choices({"STROP_API_LOOP": "", "STROP_API_HTTP": ""}) == {"loop": "auto", "http": "auto"}
    pure = {"STROP_API_LOOP": "asyncio", "STROP_API_HTTP": "h11"}
    assert server_choices(pure) == {"loop": "asyncio", "http": "h11"}


@pytest.mark.parametrize("setting", ["STROP_API_LOOP", "STROP_API_HTTP"])
def test_an_unknown_value_is_refused_naming_the_setting(setting):
    with pytest.raises(ValueError, match=f"{setting} is 'os.system'"):
        server_choices({setting: "os.system"})
