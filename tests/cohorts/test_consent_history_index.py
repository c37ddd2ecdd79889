"""The cohorts chart's last 30 days of consent changes read an index (migration cohorts.0005), which
also serves the tenant foreign key: its own index is gone (cohorts.0006)."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def test_consent_changes_are_indexed_by_tenant_and_time(db):
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "cohorts_consentchange")
    assert any(c["index"] and c["columns"] == ["tenant_id", "changed_at"] for c in constraints.values())


def test_the_tenant_key_keeps_its_constraint_without_an_index_of_its_own(db):
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "cohorts_consentchange")
    assert not any(c["index"] and c["columns"] == ["tenant_id"] for c in constraints.values())
    assert any(
        c["foreign_key"] == ("tenants_tenant", "id") and c["columns"] == ["tenant_id"] for c in constraints.values()
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="built CONCURRENTLY on Postgres only")
def test_the_index_built_concurrently_is_valid(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'cohorts_con_tenant__9e4109_idx'"
        )
        assert cursor.fetchone() == (True,)
