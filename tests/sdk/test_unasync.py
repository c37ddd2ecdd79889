"""The sync client is generated from the asyncio one (sdk/scripts/unasync.py): CI fails when a
generated file and its source disagree."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

SDK = Path(__file__).resolve().parents[2] / "sdk"
SCRIPT = SDK / "scripts" / "unasync.py"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", *args], capture_output=True, text=True, timeout=120)


def test_the_generated_sync_files_match_their_async_sources():
    result = check()
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_fails_with_a_diff_when_a_generated_file_or_its_source_was_edited_alone(tmp_path):
    copy = tmp_path / "sdk"
    shutil.copytree(SDK / "src" / "strop", copy / "src" / "strop")
    shutil.copy(SDK / "pyproject.toml", copy / "pyproject.toml")  # ruff's settings for the SDK
    package = copy / "src" / "strop"
    assert check("--package", str(package)).returncode == 0  # the copy itself is in step

    client = package / "_client.py"
    original = client.read_text()
    client.write_text(original.replace("def close(self) -> None:", "def close(self) -> None:  # edited by hand"))
    result = check("--package", str(package))
    assert result.returncode == 1
    assert "-    def close(self) -> None:  # edited by hand" in result.stdout
    assert "+    def close(self) -> None:" in result.stdout

    client.write_text(original)
    source = package / "_async_resources.py"
    source.write_text(source.read_text().replace("async def opt_out(", "async def withdraw("))
    result = check("--package", str(package))
    assert result.returncode == 1 and "+    def withdraw(" in result.stdout


def test_the_rewrite_turns_asyncio_code_into_blocking_code():
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    assert spec is not None and spec.loader is not None
    unasync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unasync)
    source = "\n".join(
        [
            "# unasync: dropped",
            "",
            "import asyncio",
            "from strop._async_drivers import run_async",
            "class AsyncThing:",
            "    async def __aenter__(self) -> AsyncThing:",
            "        async with self._lock:",
            "            async for line in response.aiter_lines():",
            "                await asyncio.sleep(0)",
            "        await self._http.aclose()",
            "        return await run_async(self._http, steps)",
            "    is_async = True  # awaiting nothing",
        ]
    )
    assert unasync.rewrite(source, set()).splitlines() == [
        "import time",
        "from strop._drivers import run_sync",
        "class Thing:",
        "    def __enter__(self) -> Thing:",
        "        with self._lock:",
        "            for line in response.iter_lines():",
        "                time.sleep(0)",
        "        self._http.close()",
        "        return run_sync(self._http, steps)",
        "    is_async = True  # awaiting nothing",
    ]
