"""The models and their migrations agree: a model change without its migration fails here, not in
a deployment's ``migrate``."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db  # makemigrations checks the applied history against the database


def test_every_model_change_has_its_migration():
    out = StringIO()
    try:
        call_command("makemigrations", check=True, dry_run=True, stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits non-zero when a migration is missing
        raise AssertionError(f"a model change has no migration:\n{out.getvalue()}") from exc
