"""The cohorts chart's last 30 days of consent changes read an index (migration cohorts.0005), which
also serves the tenant foreign key: its own index is gone (cohorts.0006); so is the end user's,
which the (end_user, changed_at) index serves (cohorts.0007)."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def test_consent_changes_are_indexed_by_tenant_and_time(db):
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "cohorts_consentchange")
    assert any(c["index"] and c["columns"] == ["tenant_id", "changed_at"] for c in constraints.values())


@pytest.mark.parametrize(("column", "target", "composite"), [
    ("tenant_id", "tenants_tenant", ["tenant_id", "changed_at"]),
    ("end_user_id", "cohorts_enduser", ["end_user_id", "changed_at"]),
])  # fmt: skip
def test_a_key_keeps_its_constraint_without_an_index_of_its_own(db, column, target, composite):
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "cohorts_consentchange")
    assert not any(c["index"] and c["columns"] == [column] for c in constraints.values())
    assert any(c["foreign_key"] == (target, "id") and c["columns"] == [column] for c in constraints.values())
    assert any(c["index"] and c["columns"] == composite for c in constraints.values())


@pytest.mark.django_db(transaction=True)  # a non-atomic migration, run outside the test's transaction
def test_the_end_user_index_drop_reverses_and_runs_again(migrate_to):
    def single_column_indexes() -> list[str]:
        with connection.cursor() as cursor:
            constraints = connection.introspection.get_constraints(cursor, "cohorts_consentchange")
        return [name for name, c in constraints.items() if c["index"] and c["columns"] == ["end_user_id"]]

    migrate_to([("cohorts", "0006_consent_change_tenant_index_in_the_tenant_changed_at_one")])
    assert single_column_indexes() == ["cohorts_consentchange_end_user_id_76ac85e6"]
    migrate_to([("cohorts", "0007_consent_change_end_user_index_in_the_end_user_changed_at_one")])
    assert single_column_indexes() == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="built CONCURRENTLY on Postgres only")
def test_the_index_built_concurrently_is_valid(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'cohorts_con_tenant__9e4109_idx'"
        )
        assert cursor.fetchone() == (True,)
