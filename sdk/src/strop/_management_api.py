"""The tenant's management calls (key scope ``admin``, but the assignment), each described once
as a :class:`Call`, as in ``_api``: the tenant and its settings, API keys, the audit log,
adapters and their versions, training, and experiments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, TypeVar

import httpx

from strop._adapter_types import Adapter, AdapterVersion, EvalSet, TrainingPolicy, TrainingRun
from strop._api import list_of, path_id
from strop._core import Call, read_json, without_none
from strop._exceptions import NotFoundError
from strop._experiment_types import Assignment, Experiment, Holdout, Snapshot
from strop._literals import Metric, Scope
from strop._management_types import ApiKey, AuditEvent, Tenant
from strop._types import items_of

T = TypeVar("T")


def _one(parse: Callable[[Any], T]) -> Callable[[httpx.Response], T]:
    return lambda response: parse(read_json(response))


def _found_in_list(parse: Callable[[Any], T], matches: Callable[[T], bool], what: str) -> Callable[[httpx.Response], T]:
    """Read one object out of a list answer, for the objects the API has no read of their own
    (an adapter): the list is one request too. None matching raises the
    ``NotFoundError`` the API would have."""

    def parse_list(response: httpx.Response) -> T:
        for item in items_of(read_json(response)):
            found = parse(item)
            if matches(found):
                return found
        error = NotFoundError(f"{what} not found", request=response.request, status_code=404, code="not_found")
        error.request_id = response.headers.get("x-request-id")
        raise error

    return parse_list


# ---- the tenant, keys, the audit log ----


def tenant_get() -> Call[Tenant]:
    return Call("GET", "/v1/tenant", parse=_one(Tenant.from_json))


def tenant_update(changes: Mapping[str, Any]) -> Call[Tenant]:
    return Call("PATCH", "/v1/tenant", parse=_one(Tenant.from_json), body=dict(changes))


def _key_path(key_id: int | str) -> str:
    return f"/v1/keys/{path_id(key_id, 'key_id')}"


def key_list() -> Call[list[ApiKey]]:
    return Call("GET", "/v1/keys", parse=list_of(ApiKey.from_json))


def key_create(*, name: str, scopes: Sequence[Scope], default_opt_in: bool | None) -> Call[ApiKey]:
    if isinstance(scopes, str):
        raise TypeError("scopes must be a list of scopes, not one string")
    body = without_none(name=name, scopes=list(scopes), default_opt_in=default_opt_in)
    # Not idempotent: a retried creation after the request was sent could issue a second key.
    return Call("POST", "/v1/keys", parse=_one(ApiKey.from_json), body=body, idempotent=False)


def key_get(key_id: int | str) -> Call[ApiKey]:
    return Call("GET", _key_path(key_id), parse=_one(ApiKey.from_json))


def key_revoke(key_id: int | str) -> Call[ApiKey]:
    return Call("DELETE", _key_path(key_id), parse=_one(ApiKey.from_json))


def audit_event_list() -> Call[list[AuditEvent]]:
    return Call("GET", "/v1/audit-events", parse=list_of(AuditEvent.from_json))


# ---- adapters and their versions ----


def adapter_path(adapter: str, tail: str = "") -> str:
    return f"/v1/adapters/{path_id(adapter, 'adapter')}{tail}"


def adapter_list() -> Call[list[Adapter]]:
    return Call("GET", "/v1/adapters", parse=list_of(Adapter.from_json))


def adapter_get(adapter: str) -> Call[Adapter]:
    path_id(adapter, "adapter")  # an empty name fails here, as everywhere
    parse = _found_in_list(Adapter.from_json, lambda found: found.name == adapter, f"adapter {adapter!r}")
    return Call("GET", "/v1/adapters", parse=parse)


def adapter_rollback(adapter: str, *, version: int) -> Call[Adapter]:
    # Not idempotent: once the first try has moved production to ``version``, a second answers 409
    # ``not_earlier``, and a lost answer would turn the rollback that happened into a ConflictError.
    path = adapter_path(adapter, "/rollback")
    return Call("POST", path, parse=_one(Adapter.from_json), body={"version": version}, idempotent=False)


def adapter_retrain(adapter: str) -> Call[TrainingRun]:
    # Not idempotent: the first try may have queued the run; a second answers 409.
    return Call("POST", adapter_path(adapter, "/retrain"), parse=_one(TrainingRun.from_json), idempotent=False)


def adapter_version_list(adapter: str) -> Call[list[AdapterVersion]]:
    return Call("GET", adapter_path(adapter, "/versions"), parse=list_of(AdapterVersion.from_json))


def adapter_version_get(adapter: str, number: int) -> Call[AdapterVersion]:
    path = adapter_path(adapter, f"/versions/{path_id(number, 'number')}")
    return Call("GET", path, parse=_one(AdapterVersion.from_json))


def adapter_version_promote(adapter: str, number: int) -> Call[Adapter]:
    path = adapter_path(adapter, f"/versions/{path_id(number, 'number')}/promote")
    return Call("POST", path, parse=_one(Adapter.from_json))


def adapter_version_purge(adapter: str, number: int) -> Call[AdapterVersion]:
    # Idempotent on the server: a purged version answers 200 as it is.
    path = adapter_path(adapter, f"/versions/{path_id(number, 'number')}/purge")
    return Call("POST", path, parse=_one(AdapterVersion.from_json))


# ---- training ----


def training_policy_get(adapter: str) -> Call[TrainingPolicy]:
    return Call("GET", adapter_path(adapter, "/training-policy"), parse=_one(TrainingPolicy.from_json))


def training_policy_update(adapter: str, changes: Mapping[str, Any]) -> Call[TrainingPolicy]:
    path = adapter_path(adapter, "/training-policy")
    return Call("PATCH", path, parse=_one(TrainingPolicy.from_json), body=dict(changes))


def training_run_list(adapter: str) -> Call[list[TrainingRun]]:
    return Call("GET", adapter_path(adapter, "/training-runs"), parse=list_of(TrainingRun.from_json))


def training_run_get(run_id: int | str) -> Call[TrainingRun]:
    path = f"/v1/training-runs/{path_id(run_id, 'run_id')}"
    return Call("GET", path, parse=_one(TrainingRun.from_json))


def training_run_exclude_window(run_id: int | str) -> Call[TrainingRun]:
    # Idempotent: leaving the same run's events out again changes nothing.
    path = f"/v1/training-runs/{path_id(run_id, 'run_id')}/exclude-window"
    return Call("POST", path, parse=_one(TrainingRun.from_json))


def training_run_start(adapter: str) -> Call[TrainingRun]:
    # Not idempotent: the first try may have queued the run; a second answers 409.
    path = adapter_path(adapter, "/training-runs")
    return Call("POST", path, parse=_one(TrainingRun.from_json), idempotent=False)


def eval_set_upload(adapter: str, cases: Sequence[Mapping[str, Any]]) -> Call[EvalSet]:
    body = {"cases": [dict(case) for case in cases]}
    return Call("PUT", adapter_path(adapter, "/eval-set"), parse=_one(EvalSet.from_json), body=body)


# ---- experiments ----


def _experiment_path(experiment_id: int | str, tail: str = "") -> str:
    return f"/v1/experiments/{path_id(experiment_id, 'experiment_id')}{tail}"


def experiment_list(adapter: str) -> Call[list[Experiment]]:
    return Call("GET", adapter_path(adapter, "/experiments"), parse=list_of(Experiment.from_json))


def experiment_create(
    adapter: str,
    *,
    candidate_version: int,
    candidate_weight: float | None,
    primary_metric: Metric | None,
    guardrails: Sequence[Metric] | None,
    secondary_metrics: Sequence[Metric] | None,
    min_users_per_arm: int | None,
    min_effective_users_per_arm: int | None,
    max_duration_s: int | None,
    alpha: float | None,
    expected_users: int | None,
    start: bool | None,
) -> Call[Experiment]:
    for name, metrics in (("guardrails", guardrails), ("secondary_metrics", secondary_metrics)):
        if isinstance(metrics, str):
            raise TypeError(f"{name} must be a list of metrics, not one string")
    body = without_none(
        candidate_version=candidate_version,
        candidate_weight=candidate_weight,
        primary_metric=primary_metric,
        guardrails=None if guardrails is None else list(guardrails),
        secondary_metrics=None if secondary_metrics is None else list(secondary_metrics),
        min_users_per_arm=min_users_per_arm,
        min_effective_users_per_arm=min_effective_users_per_arm,
        max_duration_s=max_duration_s,
        alpha=alpha,
        expected_users=expected_users,
        start=start,
    )
    # Not idempotent: a retried creation after the request was sent could make a second draft.
    path = adapter_path(adapter, "/experiments")
    return Call("POST", path, parse=_one(Experiment.from_json), body=body, idempotent=False)


def holdout_get(adapter: str) -> Call[Holdout]:
    return Call("GET", adapter_path(adapter, "/holdout"), parse=_one(Holdout.from_json))


def holdout_set(adapter: str, *, share: float) -> Call[Holdout]:
    return Call("PUT", adapter_path(adapter, "/holdout"), parse=_one(Holdout.from_json), body={"share": share})


def experiment_get(experiment_id: int | str) -> Call[Experiment]:
    return Call("GET", _experiment_path(experiment_id), parse=_one(Experiment.from_json))


def experiment_snapshots(experiment_id: int | str) -> Call[list[Snapshot]]:
    return Call("GET", _experiment_path(experiment_id, "/snapshots"), parse=list_of(Snapshot.from_json))


def experiment_act(experiment_id: int | str, action: str, *, reason: str | None = None) -> Call[Experiment]:
    """``start``, ``stop``, ``promote``, ``rollback`` or ``snapshot``. The state changes are not
    retried once sent: a second try after a lost answer would find the experiment changed (409)."""
    return Call(
        "POST",
        _experiment_path(experiment_id, f"/{action}"),
        parse=_one(Experiment.from_json),
        body=without_none(reason=reason),
        idempotent=action == "snapshot",
    )


def experiment_assignment(adapter: str, user: str, *, opted_in: bool | None) -> Call[Assignment]:
    if not user:
        raise ValueError("user must not be empty")
    return Call(
        "GET",
        adapter_path(adapter, "/assignment"),
        parse=_one(Assignment.from_json),
        params={"user": user, "opted_in": opted_in},
    )
