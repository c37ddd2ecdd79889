"""Fixtures of the serving tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from tests.serving.scripted_vllm import ScriptedVLLM, scripted_handler


@pytest.fixture
def scripted_vllm(settings) -> Iterator[ScriptedVLLM]:
    """Django pointed at a :class:`ScriptedVLLM` (its ``script`` set by the test)."""
    upstream = ScriptedVLLM()
    server = ThreadingHTTPServer(("127.0.0.1", 0), scripted_handler(upstream))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream.url = f"http://127.0.0.1:{server.server_address[1]}"
    settings.VLLM_BASE_URLS = [upstream.url]
    try:
        yield upstream
    finally:
        server.shutdown()
        server.server_close()
