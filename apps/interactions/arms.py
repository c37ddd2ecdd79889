"""Which running experiment and arm a logged interaction belongs to.

Tenants that serve elsewhere log their interactions; those of an end user the assignment
endpoint put in an arm are tagged with it, so the experiment's statistics count them. Experiments
sit above this app (their statistics read interactions), so the experiments app registers its
lookup here when it loads (``apps.experiments.apps``); until then, nothing is tagged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from apps.tenants.models import Tenant

# (tenant, [(model name, end user id)]) -> per item, (experiment id, arm) or None
ArmLookup = Callable[[Tenant, Sequence[tuple[str, str]]], list[tuple[int, str] | None]]
_lookup: list[ArmLookup] = []


def arm_lookup_register(lookup: ArmLookup) -> None:
    _lookup[:] = [lookup]


def arms_of_logged(tenant: Tenant, items: Sequence[tuple[str, str]]) -> list[tuple[int, str] | None]:
    return _lookup[0](tenant, items) if _lookup else [None] * len(items)
