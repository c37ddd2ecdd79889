"""Where built models live when nothing is passed: one cache per machine and user, so a second
checkout reuses them; an operator's explicit place wins, and a deployment's var folder keeps its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_supply.cache import default_cache_root


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("STROP_MODEL_CACHE", "STROP_VAR_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_the_user_cache_by_default_not_the_checkout(bare_env: Path) -> None:
    assert default_cache_root() == bare_env / "home" / ".cache" / "strop" / "models"
    repo = Path(__file__).resolve().parents[2]
    assert repo not in default_cache_root().parents


def test_xdg_cache_home_is_honoured(bare_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(bare_env / "xdg"))
    assert default_cache_root() == bare_env / "xdg" / "strop" / "models"


def test_a_var_dir_keeps_its_models_and_an_explicit_cache_wins(bare_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STROP_VAR_DIR", str(bare_env / "var"))
    assert default_cache_root() == bare_env / "var" / "models"
    monkeypatch.setenv("STROP_MODEL_CACHE", str(bare_env / "shared-models"))
    assert default_cache_root() == bare_env / "shared-models"
