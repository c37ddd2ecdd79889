"""The SDK builds and installs like any other package: an sdist, a wheel built from that sdist (as
``python -m build`` does), installed into a fresh virtual environment that then imports it. Its
version is one value, and it follows the API's.

The fresh environment gets its one dependency, httpx (and httpx's own), from this environment's
site-packages (linked, then found through a ``.pth`` file) instead of from PyPI: the test runs the
same offline, and ``pip check`` still proves the wheel's metadata names what it needs and nothing
it lacks. The wheel itself is installed by pip, with ``--no-deps``.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import strop
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SDK = Path(__file__).resolve().parents[2] / "sdk"


def run(*argv: str | Path, cwd: Path | None = None) -> str:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def build(hook: str, source: Path, out: Path) -> Path:
    """Call the project's PEP 517 backend (setuptools, as pyproject's build-system names it)."""
    code = f"import setuptools.build_meta as backend; print(backend.{hook}({str(out)!r}))"
    return out / run(sys.executable, "-c", code, cwd=source).strip().splitlines()[-1]


def requirement_names(requirements: list[str]) -> list[str]:
    """The distributions these requirements need on this interpreter, extras left out."""
    names = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            names.append(requirement.name)
    return names


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(f"strop_sdk-{strop.__version__}.dist-info/METADATA").decode()


def wheel_requirements(wheel: Path) -> list[str]:
    lines = wheel_metadata(wheel).splitlines()
    return requirement_names([line.split(": ", 1)[1] for line in lines if line.startswith("Requires-Dist: ")])


def link_distributions(names: list[str], into: Path) -> list[str]:
    """Link the installed distributions ``names`` and everything they need into ``into`` (their
    packages, modules and metadata); the names linked."""
    linked: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        name = canonicalize_name(dist.metadata["Name"])
        if name in linked:
            continue
        linked[name] = dist
        todo += requirement_names(dist.requires or [])
        for top in {Path(str(file)).parts[0] for file in dist.files or []} - {"..", "__pycache__"}:
            target = into / top
            if not target.exists():
                target.symlink_to(Path(str(dist.locate_file(top))))
    return sorted(linked)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist from a clean copy of sdk/, the wheel from the unpacked sdist."""
    root = tmp_path_factory.mktemp("build")
    source = root / "sdk"
    shutil.copytree(
        SDK, source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", ".ruff_cache", "build", "dist")
    )
    (dist := root / "dist").mkdir()
    sdist = build("build_sdist", source, dist)
    with tarfile.open(sdist) as archive:
        archive.extractall(root / "unpacked", filter="data")
    (unpacked,) = (root / "unpacked").iterdir()
    return sdist, build("build_wheel", unpacked, dist)


def test_the_sdist_and_the_wheel_carry_the_package_its_types_and_its_one_dependency(built):
    sdist, wheel = built
    assert sdist.name == f"strop_sdk-{strop.__version__}.tar.gz"
    assert wheel.name == f"strop_sdk-{strop.__version__}-py3-none-any.whl"
    with tarfile.open(sdist) as archive:
        sdist_files = {Path(name).relative_to(Path(name).parts[0]).as_posix() for name in archive.getnames()[1:]}
    assert {"README.md", "pyproject.toml", "src/strop/__init__.py", "src/strop/py.typed"} <= sdist_files
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    sources = {path.relative_to(SDK / "src").as_posix() for path in (SDK / "src" / "strop").glob("*.py")}
    assert sources | {"strop/py.typed"} <= names
    assert f"\nVersion: {strop.__version__}\n" in wheel_metadata(wheel)
    assert wheel_requirements(wheel) == ["httpx"]


def test_the_wheel_installs_into_a_fresh_virtual_environment_and_imports(built, tmp_path):
    _, wheel = built
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel)
    (deps := tmp_path / "deps").mkdir()
    linked = link_distributions(wheel_requirements(wheel), deps)
    assert "httpx" in linked and "django" not in linked
    site_packages = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (site_packages / "strop-test-deps.pth").write_text(f"{deps}\n")

    assert "No broken requirements found." in run(python, "-m", "pip", "check")
    printed = run(python, "-I", "-c", "import strop; print(strop.__version__); print(strop.__file__)").split()
    assert printed[0] == strop.__version__
    assert Path(printed[1]).is_relative_to(site_packages)  # the installed copy, not this checkout's


def test_the_sdk_version_is_the_apis():
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert strop.__version__ == schema["info"]["version"]
