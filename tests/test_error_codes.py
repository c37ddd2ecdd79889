"""Every error code a client can receive is declared once (``apps.common.exceptions.ERROR_CODES``),
raised only as declared, and documented in docs/api.md's table with its status, type and SDK
exception."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rest_framework import exceptions as drf_exceptions

from apps.common.exception_handler import _DRF_CODES
from apps.common.exceptions import ERROR_CODES, ApplicationError, error_type

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "docs" / "api.md").read_text()

# Where code in apps/ names an error code: a keyword argument, a class attribute, a dict key,
# error_body's first argument, and the third argument of the per-item errors (ItemError,
# MessageError) and their conditional ``code = "required" if ... else "invalid"``.
_CODE_SITES = [
    re.compile(r"\bcode=\"([a-z_]+)\""),
    re.compile(r"^\s+code = \"([a-z_]+)\"(?: if .* else \"([a-z_]+)\")?", re.M),
    re.compile(r"\"code\": \"([a-z_]+)\""),
    re.compile(r"\berror_body\(\s*\"([a-z_]+)\""),
    re.compile(r"\b(?:Item|Message)Error\((?:[^()]|\([^()]*\))*?,\s*\"([a-z_]+)\",?\s*\)", re.S),
]


def _codes_in_apps() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "apps").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        for pattern in _CODE_SITES:
            for match in pattern.finditer(text):
                for code in filter(None, match.groups()):
                    found.setdefault(code, set()).add(str(path.relative_to(ROOT)))
    return found


def _documented_rows() -> dict[str, list[str]]:
    section = DOCS.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 6:
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_scan_finds_the_codes_of_every_kind_of_site():
    found = _codes_in_apps()
    kinds = (
        "model_not_found",
        "permission_denied",
        "unknown_field",
        "required",
        "unknown_interaction",
        "length_mismatch",
    )
    for code in kinds:
        assert code in found, code


def test_every_code_raised_in_apps_is_declared():
    undeclared = {code: paths for code, paths in _codes_in_apps().items() if code not in ERROR_CODES}
    assert not undeclared, f"declare these in apps.common.exceptions.ERROR_CODES and docs/api.md: {undeclared}"


def test_every_application_error_class_has_a_declared_code_of_its_status():
    classes = [ApplicationError]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        if cls.__module__.startswith("apps."):
            assert cls.code in ERROR_CODES, cls
            assert ERROR_CODES[cls.code].status == cls.status_code, cls


def test_every_drf_error_code_is_declared():
    drf_classes = [drf_exceptions.APIException]
    while drf_classes:
        cls = drf_classes.pop()
        drf_classes.extend(cls.__subclasses__())
        if cls.__module__ == "rest_framework.exceptions" and cls is not drf_exceptions.APIException:
            code = _DRF_CODES.get(cls.default_code, cls.default_code)
            assert code in ERROR_CODES, cls
            assert ERROR_CODES[code].status == cls.status_code, cls


def test_docs_api_md_has_one_row_per_code_as_declared():
    from strop._exceptions import status_error_class

    rows = _documented_rows()
    assert set(rows) == set(ERROR_CODES), set(rows) ^ set(ERROR_CODES)
    for code, declared in ERROR_CODES.items():
        sdk = status_error_class(declared.status).__name__
        expected = [f"`{code}`", str(declared.status), f"`{declared.type}`", declared.when, declared.fix, f"`{sdk}`"]
        assert rows[code] == expected, f"docs/api.md's row for {code} should read: | {' | '.join(expected)} |"


def test_the_sdk_readme_documents_every_code():
    readme = (ROOT / "sdk" / "README.md").read_text()
    missing = [code for code in ERROR_CODES if f"`{code}`" not in readme]
    assert not missing, missing


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error")]
    + [(404, "not_found_error"), (409, "conflict_error"), (413, "invalid_request_error")]
    + [(429, "rate_limit_error"), (500, "server_error"), (503, "server_error")],
)
def test_the_type_is_the_status_family_in_openais_names(status, kind):
    assert error_type(status) == kind
