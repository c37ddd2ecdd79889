"""Fault tests: each starts the real processes it breaks (its own vLLM, Postgres, Redis)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.vllm import VLLMServer, launch_vllm_server, stop_vllm_server, wait_vllm_server

VLLM_KILL_TEST = "tests/faults/test_vllm_killed.py"


@pytest.fixture(scope="session", autouse=True)
def _vllm_to_kill(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    """vLLM takes one to three minutes to start on a busy 2-core machine, mostly importing: when the
    test that kills one is selected, its server is launched as the fault tests begin, so that the
    start overlaps the other tests instead of adding to them (that test runs last, by file name)."""
    launched: list = []
    if any(item.nodeid.startswith(VLLM_KILL_TEST) for item in request.session.items):
        from model_supply.starter import ensure_starter_model

        model_dir = Path(ensure_starter_model("tiny"))
        launched.append(launch_vllm_server(model_dir, tmp_path_factory.mktemp("vllm-to-kill") / "vllm.log"))
    try:
        yield launched
    finally:
        for proc, _ in launched:
            stop_vllm_server(proc)


@pytest.fixture
def vllm_to_kill(_vllm_to_kill: list) -> tuple[object, VLLMServer]:
    """``(process, server)``: a vLLM server of this test's own, serving, that the test may kill."""
    assert _vllm_to_kill, f"launched only for {VLLM_KILL_TEST}"
    proc, server = _vllm_to_kill[0]
    return proc, wait_vllm_server(proc, server)
