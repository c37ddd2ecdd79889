"""Settings that would fail at the first request, or hang the API, stop the settings from loading
instead, naming the variable and the value: the vLLM replicas' URLs and the API's thread counts.

Each case loads the settings in a process of its own (settings are read once per process)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRINT = (
    "import django; django.setup(); from django.conf import settings; "
    "print(settings.VLLM_BASE_URLS, settings.STROP_API_SYNC_THREADS, settings.STROP_SERVING_DB_THREADS)"
)


def _load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The embedded default's settings (nothing of this process's environment but what finds Python),
    plus ``env``."""
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    base.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        STROP_VAR_DIR=str(tmp_path / "var"),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
    )
    return subprocess.run(
        [sys.executable, "-c", PRINT], cwd=ROOT, env={**base, **env}, capture_output=True, text=True,
        timeout=180, check=False,
    )


BAD_URLS = [
    ("", "VLLM_BASE_URLS is empty"),
    (" , ", "VLLM_BASE_URLS is empty"),
    ("http://vllm:81OO", "'http://vllm:81OO' is not an http(s) URL"),
    ("127.0.0.1:8100", "'127.0.0.1:8100' is not an http(s) URL"),
    ("http://vllm:8100,vllm:8101", "'vllm:8101' is not an http(s) URL"),
    ("ftp://vllm:8100", "'ftp://vllm:8100' is not an http(s) URL"),
    ("http://:8100", "'http://:8100' is not an http(s) URL"),
    ("http://vllm:0", "'http://vllm:0' is not an http(s) URL"),
    ("http://vllm:70000", "'http://vllm:70000' is not an http(s) URL"),
]


def test_vllm_base_urls_that_cannot_reach_a_replica_stop_the_settings_naming_the_item(tmp_path):
    with ThreadPoolExecutor(max_workers=3) as pool:
        done = list(pool.map(lambda case: _load_settings(tmp_path, VLLM_BASE_URLS=case[0]), BAD_URLS))
    for (value, says), result in zip(BAD_URLS, done, strict=True):
        assert result.returncode != 0, (value, result.stdout)
        assert says in result.stderr, (value, result.stderr[-2000:])
        assert "VLLM_BASE_URLS" in result.stderr


def test_good_vllm_base_urls_load_as_the_replicas(tmp_path):
    result = _load_settings(tmp_path, VLLM_BASE_URLS="http://vllm-1:8100, https://vllm-2.internal,http://[::1]:8101/")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "['http://vllm-1:8100', 'https://vllm-2.internal', 'http://[::1]:8101/']" in result.stdout


@pytest.mark.parametrize("name", ["STROP_API_SYNC_THREADS", "STROP_SERVING_DB_THREADS"])
def test_zero_threads_stop_the_settings_instead_of_hanging_or_failing_every_request(tmp_path, name):
    result = _load_settings(tmp_path, **{name: "0"})
    assert result.returncode != 0, result.stdout
    assert f"{name}=0: at least 1" in result.stderr, result.stderr[-2000:]
