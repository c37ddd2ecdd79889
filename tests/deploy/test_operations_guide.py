"""The operator's guides' compose commands (docs/deploy.md, operate.md, security.md) against the
files they use: every service a `strop-compose` command names is a service of the compose file,
every `manage.py` command it runs exists and takes the options given, every compose, example and
script file it names is there; and its check for versions whose objects are missing, run as written
against an S3-compatible store, names exactly those."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import textwrap

import pytest
from django.core.management import get_commands, load_command_class

from apps.adapters.services import adapter_create, adapter_version_register, base_model_register
from tests.deploy.layout import ROOT, compose

GUIDES = tuple(ROOT / "docs" / name for name in ("deploy.md", "operate.md", "security.md"))


def guide_text() -> str:
    return "\n".join(path.read_text() for path in GUIDES)
# `docker compose` options that take a value, per verb (the ones the guide uses and their kin).
VALUED = {
    "run": {"-u", "--user", "-v", "--volume", "-e", "--env", "--entrypoint", "-w", "--workdir", "--name"},
    "exec": {"-u", "--user", "-e", "--env", "-w", "--workdir"},
    "up": {"--scale", "--wait-timeout", "-t", "--timeout"},
    "stop": {"-t", "--timeout"},
}


def compose_commands() -> list[list[str]]:
    """Each `strop-compose VERB ...` of the guide, in code blocks and inline code, as words up to the
    end of its line, its comment, a pipe, a redirection or the closing backtick."""
    found = []
    for line in guide_text().splitlines():
        for match in re.finditer(r"strop-compose (\w[^`|<>#&]*)", line):
            text = match.group(1).rstrip(")").strip()
            if text.count("'") % 2:  # a quoted script that goes on below: `shell -c '`
                text = text[: text.rindex("'")]
            found.append(shlex.split(text))
    return found


def split(words: list[str]) -> tuple[str, list[str], list[str]]:
    """(verb, the services it names, the command run in the service's container for exec and run)."""
    verb, rest = words[0], words[1:]
    positional = []
    while rest:
        word = rest.pop(0)
        if word.startswith("-"):
            if word in VALUED.get(verb, set()):
                rest.pop(0)
            continue
        positional.append(word)
        if verb in {"exec", "run"}:
            return verb, positional, rest
    return verb, positional, []


def test_every_service_the_guide_names_is_in_the_compose_file():
    services = set(compose()["services"])
    commands = compose_commands()
    assert len(commands) >= 30  # the pattern still finds them
    verbs = set()
    for words in commands:
        verb, named, _ = split(words)
        verbs.add(verb)
        assert verb in VALUED | {"ps": set(), "build": set()}, words
        assert set(named) <= services, f"strop-compose {' '.join(words)}: no service {sorted(set(named) - services)}"
    assert {"exec", "run", "up", "stop"} <= verbs


def test_every_manage_py_command_the_guide_runs_in_a_container_takes_the_options_given():
    commands = get_commands()
    checked = 0
    for words in compose_commands():
        _, _, command = split(words)
        if command[:2] != ["python", "manage.py"] or len(command) < 3:
            continue
        name = command[2]
        assert name in commands, f"manage.py has no command {name}"
        parser = load_command_class(commands[name], name).create_parser("manage.py", name)
        known = {option for action in parser._actions for option in action.option_strings}
        given = {word.split("=")[0] for word in command[3:] if word.startswith("--")}
        assert given <= known, f"{name} takes no {sorted(given - known)}"
        checked += 1
    assert checked >= 6


def test_every_file_the_guide_names_under_platform_is_there():
    named = set(re.findall(r"platform/[\w./-]*[\w]", guide_text()))
    ours = {"platform/docker/compose.one-gpu.yaml", "platform/nginx-strop.conf", "platform/docker/build-images.sh"}
    assert ours <= named
    filled_in = {"platform/compose.env", "platform/store-root.env"}  # made by the operator from the examples
    missing = sorted(path for path in named - filled_in if not (ROOT / path).exists())
    assert missing == []


def missing_objects_check() -> str:
    """The Python of the guide's check for versions without their objects, as pasted."""
    text = guide_text()
    block = re.search(r"manage\.py shell -c '\n(.*?)\n\s*'\n", text, re.DOTALL)
    assert block, "the check is in the guide"
    return textwrap.dedent(block.group(1))


@pytest.mark.django_db
def test_the_guides_check_names_the_versions_whose_manifest_is_missing(
    s3_store, object_store, make_tenant, tiny_starter_model, make_lora_adapter
):
    tenant = make_tenant("acme")
    base = base_model_register(name="base", path=tiny_starter_model)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    kept, lost = (
        adapter_version_register(tenant, adapter=adapter, source_dir=make_lora_adapter(seed), enqueue_load=False)
        for seed in (31, 32)
    )
    bucket, _, prefix = s3_store.removeprefix("s3://").partition("/")
    object_store.client().delete_object(Bucket=bucket, Key=f"{prefix}/{lost.vllm_name}/strop-manifest.json")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(missing_objects_check(), {})  # noqa: S102 (the guide's own snippet, as manage.py shell -c runs it)
    assert printed.getvalue() == f"missing: {lost.vllm_name}\n"
    assert kept.artifact_path.startswith("s3://") and lost.artifact_path.startswith("s3://")
