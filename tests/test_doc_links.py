"""Every relative link and every ``#anchor`` in the docs resolves: a reader who follows one lands on
the file and the heading it names. Anchors use GitHub's heading slugs (lowercase, punctuation other
than hyphens and spaces dropped, spaces to hyphens, a repeated heading gets ``-1``, ``-2``, …)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [
        REPO_ROOT / "README.md",
        *(REPO_ROOT / "docs").glob("*.md"),
        REPO_ROOT / "sdk" / "README.md",
        REPO_ROOT / "platform" / "README.md",
        REPO_ROOT / "gpu_trainer" / "README.md",
        REPO_ROOT / "model_supply" / "README.md",
        REPO_ROOT / "benchmarks" / "results-log.md",
    ]
)
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the target ends at whitespace (an optional "title" follows).
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_LINK = re.compile(r"""<(?:a|img)\s[^>]*?(?:href|src)=["']([^"']+)["']""")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _prose_lines(text: str, *, blank_code: bool = True) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked unless told not to."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(CODE_SPAN.sub("", line) if blank_code else line)
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (markup removed the way its renderer does)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)  # drop punctuation except hyphens and spaces
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in _prose_lines(path.read_text(encoding="utf-8"), blank_code=False):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    # Explicit anchors: <a id="…"> / <a name="…">.
    text = path.read_text(encoding="utf-8")
    found |= set(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", text))
    return found


def links(path: Path) -> list[str]:
    targets = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        targets += INLINE_LINK.findall(line)
        targets += HTML_LINK.findall(line)
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
    return targets


def _is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)) or target.startswith("//")


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(path):
        if _is_external(target):
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not destination.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and destination.suffix == ".md" and unquote(anchor).lower() not in anchors(destination):
            broken.append(f"{target}: no heading with that anchor in {os.path.relpath(destination, path.parent)}")
    return broken


def test_github_slugs():
    assert github_slug("Integrate in five minutes") == "integrate-in-five-minutes"
    assert github_slug("Every signal, and the credit each token gets") == "every-signal-and-the-credit-each-token-gets"
    assert github_slug("Operators: metrics and logs") == "operators-metrics-and-logs"
    assert github_slug("`make up` — one host") == "make-up--one-host"
    assert github_slug("Experiments: a candidate meets users only in an A/B test (key scope `admin`)") == (
        "experiments-a-candidate-meets-users-only-in-an-ab-test-key-scope-admin"
    )
    assert github_slug("Security: what Strop promises and what the operator must do") == (
        "security-what-strop-promises-and-what-the-operator-must-do"
    )


def test_repeated_headings_are_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Setup\n\n## Setup\n\n```\n# Setup\n```\n\n## Setup\n", encoding="utf-8")
    assert anchors(page) == {"setup", "setup-1", "setup-2"}


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Agents: chat completions\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Here\n[ok](other.md#agents-chat-completions) [self](#here) `[code](#not-a-link)`\n"
        "[gone](missing.md) [no heading](other.md#agents) [nor here](#there) [web](https://x.y/#z)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#agents: no heading with that anchor in other.md",
        "#there: no heading with that anchor in page.md",
    ]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_and_anchor_resolves(path):
    assert path.exists(), path
    assert broken_links(path) == []


# A section named in prose or a comment: README, "Agents" / operate.md, "Backup and restore".
NAMED_SECTION = re.compile(r"""\b(README|[\w-]+\.md)(?:'s)?,?\s+"([^"\n]+)"(?:\s+section)?""")
SCANNED_SOURCES = (
    "apps",
    "config",
    "workers",
    "platform",
    "sdk",
    "gpu_trainer",
    "learning_shared",
    "model_supply",
    "demo",
    "benchmarks",
    "tests",
    "docs",
    "templates",
)


def _guide(name: str) -> Path | None:
    if name in ("README", "README.md"):
        return REPO_ROOT / "README.md"
    for candidate in (REPO_ROOT / "docs" / name, REPO_ROOT / name):
        if candidate.exists():
            return candidate
    return None


def named_section_references() -> list[tuple[str, str, str]]:
    """(where, file named, section named) for each such reference in the sources and docs."""
    files = [REPO_ROOT / "README.md", REPO_ROOT / "Makefile"]
    for top in SCANNED_SOURCES:
        files += [p for p in (REPO_ROOT / top).rglob("*") if p.suffix in {".py", ".md", ".sh", ".yaml", ".html"}]
    found = []
    for path in files:
        if path.resolve() == Path(__file__).resolve() or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for guide, section in NAMED_SECTION.findall(line):
                found.append((f"{path.relative_to(REPO_ROOT)}:{number}", guide, section))
    return found


def test_sections_named_in_prose_and_comments_exist():
    references = named_section_references()
    assert any(guide == "README" for _, guide, _ in references)  # the pattern still finds them
    missing = []
    for where, guide, section in references:
        path = _guide(guide)
        slug = github_slug(section)
        if path is None or not any(anchor.startswith(slug) for anchor in anchors(path)):
            missing.append(f'{where}: {guide}, "{section}"')
    assert missing == []


def shell_commands(path: Path) -> list[str]:
    """Each command of the guide's ``sh`` blocks, continuation lines joined."""
    blocks = re.findall(r"```(?:sh|bash|shell)\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    commands = []
    for block in blocks:
        pending = ""
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            pending = f"{pending}\n{line}" if pending else line
            if pending.count("'") % 2 == 0 and pending.strip():  # a quoted body may span lines
                commands.append(pending.strip())
                pending = ""
        if pending.strip():
            commands.append(pending.strip())
    return commands


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_guides_continue_the_readme_quickstart(path):
    """The README's variables and tenant, so a guide's blocks paste after the quickstart's."""
    text = path.read_text(encoding="utf-8")
    assert not re.findall(r"\$\{?STROP\b", text)  # $STROP_BASE_URL and $STROP_API_KEY
    if not re.search(r"^KEY=", text, flags=re.M):  # the README's quickstart sets it from tenant_create
        assert not re.findall(r"\$\{?KEY\b", text)
    assert "acme-corp" not in text
    for command in shell_commands(path):
        slug = re.search(r"manage\.py (?:api_key_create|adapter_create|tenant_[a-z_]+) (?:\"[^\"]*\"|(\S+))", command)
        if slug and slug.group(1) and not slug.group(1).startswith("-"):
            assert slug.group(1) == "acme", command
        assert "curl …" not in command, f"not pasteable: {command}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_curl_answers_end_with_a_newline(path):
    """A JSON answer has no newline of its own: printed to the terminal, the prompt runs on after
    it. Each curl whose answer is shown asks for one (``-w '\\n'``); captured and streamed ones
    (server-sent events end in blank lines) need none."""
    for command in shell_commands(path):
        for call in re.split(r"\s(?:&&|\|\||;)\s", command):
            if not re.match(r"(?:\w+=)?curl\s", call.strip()) or "$(curl" in command or "| " in call:
                continue
            if '"stream": true' in call or "/metrics" in call:  # text/event-stream and Prometheus text end in newlines
                continue
            assert re.search(r"\s(?:-w|--write-out)\s+'\\n'", call), f"no -w '\\n': {call}"
