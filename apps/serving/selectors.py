"""What a serving request reads before it asks vLLM, in one round trip: the API key's own.

A completion needs the adapter it names (with its base model and production version), the end
user's stored consent and the adapter's running experiment (with both arms' versions). Read one
after the other they were three round trips to Postgres on every request, each waiting longer
than its query takes while vLLM keeps the cores busy; here the three go together
(``joined_rows``). One statement joining all seven tables cost the planner more than the trips.

The serving views name them from the raw body before authentication (``ReadAhead``), so they
go with the API key's statement, the tenant given by the key's prefix; the rows are used once
the key proved valid, and only for its tenant. Otherwise ``serving_lookup`` reads them itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.db import connection

from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.selectors import ADAPTER_ROW, adapter_of_row, adapter_row_sql, adapter_where
from apps.cohorts.models import EndUser
from apps.common.lookups import Read, joined_rows, model_columns
from apps.experiments.models import Experiment
from apps.tenants.models import Tenant
from apps.tenants.selectors import tenant_of_key_sql

_EXPERIMENT_ROW = (Experiment, AdapterVersion, AdapterVersion)


@dataclass(frozen=True)
class ServingLookup:
    adapter: Adapter  # with base_model and production_version
    end_user: EndUser | None  # the named end user as stored; None: never seen (or none named)
    experiment: Experiment | None  # the adapter's running experiment, with both arms' versions


@dataclass
class ReadAhead:
    """What a serving request will read, named from its raw body before the API key is checked,
    so that the three statements go in the key's own round trip (``api_key_find_with``) with the
    key's tenant as a subquery. ``rows`` is set only once the key proved valid; serving_lookup
    uses them only for the same adapter name and end user, and the same tenant."""

    name: str | None
    external_id: str
    rows: list | None = None
    tenant_id: int | None = None

    def reads(self, prefix: str) -> list[Read]:
        return _reads(tenant_of_key_sql(), [prefix], name=self.name, external_id=self.external_id)


@functools.cache
def _statements(named: bool, tenant: str, vendor: str) -> tuple[str, str, str]:
    """The adapter, experiment and end-user statements, the tenant named by ``tenant`` (its id's
    placeholder, or a subquery); ``vendor`` keys the cache: quoting differs."""
    quote = connection.ops.quote_name
    versions = quote(AdapterVersion._meta.db_table)
    # The first statement's adapter, found again by the same condition: its id is not known yet.
    adapter_id = (
        f"SELECT a.id FROM {quote(Adapter._meta.db_table)} a WHERE {adapter_where(named=named, tenant=tenant)} "
        "ORDER BY a.id LIMIT 1"
    )
    experiment = (
        f"SELECT {model_columns(Experiment, 'x')}, {model_columns(AdapterVersion, 'xc')}, "
        f"{model_columns(AdapterVersion, 'xk')} FROM {quote(Experiment._meta.db_table)} x "
        f"LEFT JOIN {versions} xc ON xc.id = x.control_version_id "
        f"LEFT JOIN {versions} xk ON xk.id = x.candidate_version_id "
        f"WHERE x.adapter_id = ({adapter_id}) AND x.status = %s"
    )
    end_user = (
        f"SELECT {model_columns(EndUser, 'e')} FROM {quote(EndUser._meta.db_table)} e "
        f"WHERE e.tenant_id = {tenant} AND e.external_id = %s"
    )
    return adapter_row_sql(named=named, tenant=tenant), experiment, end_user


def _reads(tenant: str, tenant_params: list, *, name: str | None, external_id: str) -> list[Read]:
    which = [*tenant_params, name] if name else tenant_params
    adapter_sql, experiment_sql, end_user_sql = _statements(bool(name), tenant, connection.vendor)
    reads: list[Read] = [
        (adapter_sql, which, ADAPTER_ROW),
        (experiment_sql, [*which, Experiment.Status.RUNNING.value], _EXPERIMENT_ROW),
    ]
    if external_id:
        reads.append((end_user_sql, [*tenant_params, external_id], (EndUser,)))
    return reads


def serving_lookup(
    tenant: Tenant, *, name: str | None, external_id: str, ahead: ReadAhead | None = None
) -> ServingLookup:
    """The adapter ``name`` names (the default one when empty; 404 when none), the end user
    ``external_id`` names and the adapter's running experiment, in one round trip, or in none
    when ``ahead`` read them with the API key."""
    if (
        ahead is not None
        and ahead.rows is not None
        and (ahead.tenant_id, ahead.name, ahead.external_id) == (tenant.pk, name, external_id)
    ):
        found = ahead.rows
    else:
        found = joined_rows(_reads("%s", [tenant.pk], name=name, external_id=external_id))
    adapter = adapter_of_row(found[0], tenant=tenant, name=name)
    experiment = None
    if found[1] is not None:
        experiment, experiment.control_version, experiment.candidate_version = found[1]
        experiment.adapter = adapter
    end_user = found[2][0] if external_id and found[2] is not None else None
    return ServingLookup(adapter=adapter, end_user=end_user, experiment=experiment)
