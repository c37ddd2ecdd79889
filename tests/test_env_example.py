"""platform/env.example lists every setting the project's configuration reads from the environment
(set, or commented out with its default), so an operator finds them all in one place."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# How config/ reads a variable: os.environ.get("X"...), os.environ["X"], os.getenv("X"), env_*("X", ...).
READ = re.compile(r"""(?:os\.environ\.get|os\.environ\[|os\.getenv|env_[a-z]+)\(?\s*["']([A-Z][A-Z0-9_]+)["']""")
LISTED = re.compile(r"^#?\s?([A-Z][A-Z0-9_]+)=", re.MULTILINE)


# platform/vllm.sh documents what it reads in its opening comment ("#   VLLM_X   what it does").
DOCUMENTED = re.compile(r"^#   ([A-Z][A-Z0-9_]+) ", re.MULTILINE)


def settings_read() -> set[str]:
    return {name for path in (REPO_ROOT / "config").glob("*.py") for name in READ.findall(path.read_text())}


def replica_settings_read() -> set[str]:
    """What a vLLM replica reads: platform/vllm.sh's documented settings and Strop's vLLM plugins."""
    plugins = (REPO_ROOT / "platform" / "vllm_plugins").glob("*.py")
    return set(DOCUMENTED.findall((REPO_ROOT / "platform" / "vllm.sh").read_text())) | {
        name for path in plugins for name in READ.findall(path.read_text())
    }


def test_env_example_lists_every_setting_the_configuration_reads():
    read = settings_read()
    assert len(read) > 40  # the pattern still finds what config/ reads
    listed = set(LISTED.findall((REPO_ROOT / "platform" / "env.example").read_text()))
    assert sorted(read - listed) == []


def test_env_example_lists_every_setting_a_vllm_replica_reads():
    read = replica_settings_read()
    assert {"VLLM_BIND_HOST", "STROP_VLLM_ADAPTER_CACHE", "AWS_ENDPOINT_URL"} <= read  # the patterns still match
    listed = set(LISTED.findall((REPO_ROOT / "platform" / "env.example").read_text()))
    assert sorted(read - listed) == []
