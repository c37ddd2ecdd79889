"""The hot paths' plain statements: prepared on their connection, sent together, logged and
failing as Django's own queries do (apps.common.lookups.prepared_cursor, joined_rows)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.utils import ProgrammingError
from django.test.utils import CaptureQueriesContext

from apps.common.lookups import joined_rows, prepared_cursor
from apps.tenants.models import ApiKey, Tenant
from config.env import database_from_url

pytestmark = pytest.mark.django_db

_KEY = "SELECT k.id, k.prefix, k.tenant_id FROM tenants_apikey k WHERE k.prefix = %s"
_TENANT = "SELECT t.id, t.slug, t.name FROM tenants_tenant t WHERE t.slug = %s"


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def _row(sql: str, params: list) -> tuple:
    with connection.cursor() as cursor:  # Django's own cursor: bound on the client, never prepared
        cursor.execute(sql, params)
        return cursor.fetchone()


def test_a_hot_statement_is_prepared_at_its_second_use_and_answers_as_before(client_a):
    key = ApiKey.objects.get(tenant=client_a.tenant)
    statement = _KEY + " AND k.name <> 'never a key name'"  # a statement no other test sends
    answers = []
    for _ in range(3):
        with prepared_cursor() as cursor:
            cursor.execute(statement, [key.prefix])
            answers.append(cursor.fetchone())
    assert answers == [_row(statement, [key.prefix])] * 3 == [(key.pk, key.prefix, key.tenant_id)] * 3
    assert [s for s in _prepared() if "never a key name" in s] == [statement.replace("%s", "$1")]


def test_reads_go_together_in_one_logged_trip_each_prepared(client_a, make_tenant):
    key, other = ApiKey.objects.get(tenant=client_a.tenant), make_tenant("other")
    reads = [
        (_KEY + " AND k.name <> 'together'", [key.prefix], (ApiKey,)),
        (_TENANT + " AND t.name <> 'together'", [other.slug], (Tenant,)),
        (_TENANT + " AND t.name <> 'together'", ["no-such-tenant"], (Tenant,)),
    ]
    reads = [(sql, params, ()) for sql, params, _ in reads]  # no models: compare the raw rows
    with CaptureQueriesContext(connection) as captured:
        first = joined_rows(reads)
    again = joined_rows(reads)
    assert first == again == [[], [], None]  # a row (no model to build), a row, none
    # One entry for the one round trip, with the parameters written in, as Django logs its own.
    assert len(captured.captured_queries) == 1
    logged = captured.captured_queries[0]["sql"]
    assert f"k.prefix = '{key.prefix}'" in logged and f"t.slug = '{other.slug}'" in logged
    assert logged.count("; ") == 2
    assert len([s for s in _prepared() if "'together'" in s]) == 2  # the tenant statement once


def test_a_failing_statement_raises_djangos_error_and_the_connection_goes_on(client_a):
    reads = [(_TENANT, [client_a.tenant.slug], ()), ("SELECT nothing FROM no_such_table WHERE id = %s", [1], ())]
    with pytest.raises(ProgrammingError, match="no_such_table"), transaction.atomic():
        joined_rows(reads)
    with pytest.raises(ProgrammingError, match="no_such_table"), transaction.atomic():
        with prepared_cursor() as cursor:
            cursor.execute(reads[1][0], reads[1][1])
    assert joined_rows(reads[:1]) == [[]]  # a row; the connection still answers


def test_preparing_can_be_turned_off_for_a_transaction_pooler(monkeypatch):
    assert database_from_url("postgres://u@h/db")["OPTIONS"] == {"prepare_threshold": 1}
    monkeypatch.setenv("DATABASE_PREPARED_STATEMENTS", "0")
    assert database_from_url("postgres://u@h/db")["OPTIONS"] == {"prepare_threshold": None}


def test_lookups_of_many_values_are_planned_each_time_never_prepared(client_a):
    """A prepared statement keeps the generic plan Postgres chose while the table was small (every
    row of the tenant, filtered against the array): a batch's ``= ANY(array)`` lookup grew with the
    table, from 44 to 230 ms a batch of 500 within 30,000 rows. Those lookups are planned each time."""
    from apps.interactions.services import feedback_ingest, interactions_ingest

    tenant = client_a.tenant
    for batch in range(4):
        items = [{"client_id": f"many-{batch}-{n}", "prompt": "p", "completion": "c"} for n in range(3)]
        assert {r.status for r in interactions_ingest(tenant, items=items)} == {"created"}
        assert {r.status for r in interactions_ingest(tenant, items=items)} == {"duplicate"}
        feedback = [{"client_id": item["client_id"], "outcome": "accepted"} for item in items]
        assert {r.status for r in feedback_ingest(tenant, items=feedback)} == {"recorded"}
    assert [s for s in _prepared() if "ANY(" in s.upper().replace(" ", "")] == []


def _generic_plan_on_a_new_table(statement: str, types: list[str], table: str) -> str:
    """The plan Postgres would keep for ``statement`` (``force_generic_plan``) if ``table`` were new
    and never analyzed, as in a new database: planned on a copy of it with its columns and indexes,
    whatever the test database's own table has been through."""
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE TEMP TABLE new_copy (LIKE "{table}" INCLUDING ALL) ON COMMIT DROP')
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        copied = statement.replace(f'"{table}"', "new_copy")
        cursor.execute(f"PREPARE generic_probe({', '.join(types)}) AS {copied}")
        try:
            cursor.execute(f"EXPLAIN EXECUTE generic_probe({', '.join(['NULL'] * len(types))})")
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE generic_probe")


def test_feedback_by_interaction_id_keeps_a_primary_key_plan_made_on_an_empty_table(client_a):
    """The single-feedback upsert by interaction id is prepared, and the plan Postgres keeps may be
    made while the table is new, where an index on the tenant alone cost as little as the primary
    key: that plan filtered every interaction of the tenant until it was made again. The tenant is
    compared so that no index serves it, and the primary key finds the row."""
    from apps.interactions.services import feedback_ingest, interactions_ingest

    tenant = client_a.tenant
    (stored,) = interactions_ingest(tenant, items=[{"client_id": "by-id", "prompt": "p", "completion": "c"}])
    for outcome in ("accepted", "rejected"):  # prepared at its second use
        (result,) = feedback_ingest(tenant, items=[{"interaction_id": stored.id, "outcome": outcome}])
        assert result.status == "recorded"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement, parameter_types::text[] FROM pg_prepared_statements "
            "WHERE statement LIKE 'INSERT INTO \"interactions_feedback\"%%' AND statement LIKE '%%i.id = $%%'"
        )
        (statement, types), *others = cursor.fetchall()
    assert others == []
    plan = _generic_plan_on_a_new_table(statement, types, "interactions_interaction")
    assert "Index Scan using new_copy_pkey on new_copy" in plan, plan
    assert "Filter: ((tenant_id + 0) = $" in plan, plan  # the wall still holds, on the one row found
