"""What a serving request reads before it asks vLLM, in one round trip.

A completion needs the adapter it names (with its base model and production version), the end
user's stored consent and the adapter's running experiment (with both arms' versions). Read one
after the other they were three round trips to Postgres on every request, each waiting longer
than its query takes while vLLM keeps the cores busy; here the three go together
(``joined_rows``). One statement joining all seven tables cost the planner more than the trips.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.db import connection

from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.selectors import ADAPTER_ROW, adapter_of_row, adapter_row_sql, adapter_where
from apps.cohorts.models import EndUser
from apps.common.lookups import joined_rows, model_columns
from apps.experiments.models import Experiment
from apps.tenants.models import Tenant

_EXPERIMENT_ROW = (Experiment, AdapterVersion, AdapterVersion)


@dataclass(frozen=True)
class ServingLookup:
    adapter: Adapter  # with base_model and production_version
    end_user: EndUser | None  # the named end user as stored; None: never seen (or none named)
    experiment: Experiment | None  # the adapter's running experiment, with both arms' versions


@functools.cache
def _statements(named: bool, vendor: str) -> tuple[str, str, str]:
    """The adapter, experiment and end-user statements (``vendor`` keys the cache: quoting differs)."""
    quote = connection.ops.quote_name
    versions = quote(AdapterVersion._meta.db_table)
    # The first statement's adapter, found again by the same condition: its id is not known yet.
    adapter_id = (
        f"SELECT a.id FROM {quote(Adapter._meta.db_table)} a WHERE {adapter_where(named=named)} ORDER BY a.id LIMIT 1"
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
        f"WHERE e.tenant_id = %s AND e.external_id = %s"
    )
    return adapter_row_sql(named=named), experiment, end_user


def serving_lookup(tenant: Tenant, *, name: str | None, external_id: str) -> ServingLookup:
    """The adapter ``name`` names (the default one when empty; 404 when none), the end user
    ``external_id`` names and the adapter's running experiment, in one round trip."""
    which = [tenant.pk, name] if name else [tenant.pk]
    adapter_sql, experiment_sql, end_user_sql = _statements(bool(name), connection.vendor)
    reads = [
        (adapter_sql, which, ADAPTER_ROW),
        (experiment_sql, [*which, Experiment.Status.RUNNING.value], _EXPERIMENT_ROW),
    ]
    if external_id:
        reads.append((end_user_sql, [tenant.pk, external_id], (EndUser,)))
    found = joined_rows(reads)
    adapter = adapter_of_row(found[0], name=name)
    experiment = None
    if found[1] is not None:
        experiment, experiment.control_version, experiment.candidate_version = found[1]
        experiment.adapter = adapter
    end_user = found[2][0] if external_id and found[2] is not None else None
    return ServingLookup(adapter=adapter, end_user=end_user, experiment=experiment)
