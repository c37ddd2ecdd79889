"""End users: consent as requests and admins change it, and bulk import (erasure: apps.privacy).

What a request's ``opted_in`` means: it states the end user's consent *now*, as the tenant's
product knows it (source "request"): ``true`` opts them in, ``false`` opts them out, and either is
written to the history when it changes the state. A request without the flag leaves the state as
it is; a user seen for the first time without one takes the key's default, else the tenant's.
Each interaction records the state at the moment it happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.cohorts.models import ConsentChange, EndUser
from apps.common.exceptions import PayloadTooLarge, ValidationFailed
from apps.common.lookups import in_values, tenant_rows
from apps.common.parsing import end_user_id_check
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record


def _history(tenant: Tenant, user_id: int, opted_in: bool, *, source: str, actor: str, at: datetime) -> ConsentChange:
    return ConsentChange(
        tenant=tenant, end_user_id=user_id, opted_in=opted_in, source=source, actor=actor, changed_at=at
    )


def end_users_observe(
    tenant: Tenant,
    *,
    observations: Sequence[tuple[str, bool | None]],
    source: str,
    actor: str,
    default: bool,
    known: Mapping[str, tuple[int, bool] | None] | None = None,
) -> list[bool]:
    """Apply (external id, flag or None) in order and answer each one's consent at that moment.

    The ingest and serving hot path: one query for the users a batch names, more only for users
    seen for the first time or whose consent changes. ``known`` is what the caller already read
    of some of them: their stored (id, consent), None for one not stored; they are not read again.
    An empty id is nobody: never consenting. Runs in the caller's transaction.
    """
    ids = {external_id for external_id, _ in observations if external_id}
    if not ids:
        return [False] * len(observations)
    now = timezone.now()
    known = known or {}
    # (id, consent) per external id: plain values, not model instances (a batch names hundreds).
    users: dict[str, tuple[int, bool]] = {
        external_id: row for external_id, row in known.items() if external_id in ids and row is not None
    }
    unread = ids - known.keys()
    if unread:
        users.update(
            (external_id, (pk, opted_in))
            for external_id, pk, opted_in in tenant_rows(
                EndUser, tenant.pk, key="external_id", values=unread, columns=("external_id", "id", "opted_in")
            )
        )
    missing = ids - users.keys()
    history: list[ConsentChange] = []
    if missing:
        first_flag: dict[str, bool | None] = {}
        for external_id, flag in observations:
            if external_id in missing and external_id not in first_flag:
                first_flag[external_id] = flag
        EndUser.objects.bulk_create(
            [
                EndUser(
                    tenant=tenant,
                    external_id=external_id,
                    opted_in=default if first_flag[external_id] is None else bool(first_flag[external_id]),
                    opted_in_changed_at=now,
                )
                for external_id in sorted(missing)  # one lock order for every request: no deadlock
            ],
            ignore_conflicts=True,  # another request created some of them first: theirs stand
        )
        created = EndUser.objects.filter(tenant=tenant, **in_values("external_id", missing)).values_list(
            "external_id", "pk", "opted_in", "opted_in_changed_at"
        )
        for external_id, pk, opted_in, changed_at in created:
            users[external_id] = (pk, opted_in)
            if opted_in and changed_at == now:
                flagged = first_flag.get(external_id) is not None
                history.append(_history(tenant, pk, True, source=source if flagged else "default", actor=actor, at=now))
    state = {external_id: opted_in for external_id, (_, opted_in) in users.items()}
    states: list[bool] = []
    changed: set[str] = set()
    for external_id, flag in observations:
        if not external_id:
            states.append(False)
            continue
        if flag is not None and flag != state[external_id]:
            state[external_id] = flag
            changed.add(external_id)
            history.append(_history(tenant, users[external_id][0], flag, source=source, actor=actor, at=now))
        states.append(state[external_id])
    for external_id in sorted(changed):  # locks taken in one order, as the inserts above
        pk, opted_in = users[external_id]
        if state[external_id] != opted_in:
            EndUser.objects.filter(pk=pk).update(
                opted_in=state[external_id], opted_in_changed_at=now
            )
    if history:
        ConsentChange.objects.bulk_create(history)
    return states


def end_user_consent_now(
    tenant: Tenant,
    *,
    external_id: str,
    flag: bool | None,
    default: bool,
    actor: str,
    stored: EndUser | None,
) -> bool:
    """The consent of the end user a request names, after applying its flag (see the module
    docstring). ``stored``: the end user as the request read it (``serving_lookup``; None: not
    stored yet), so it is not read again."""
    known = {external_id: None if stored is None else (stored.pk, stored.opted_in)}
    return end_users_observe(
        tenant,
        observations=[(external_id, flag)],
        source=ConsentChange.Source.REQUEST,
        actor=actor,
        default=default,
        known=known,
    )[0]


@transaction.atomic
def end_user_consent_set(tenant: Tenant, *, external_id: str, opted_in: bool, source: str, actor: str) -> EndUser:
    """Opt one end user in or out (created if new), and audit it. The user's row is locked and read
    as committed: a request recording them at the same moment (its consent flag not yet committed)
    is waited for, so this change, the later one, is the one that stands, with its history row."""
    _check_external_id(external_id)
    row = (
        EndUser.objects.select_for_update()
        .filter(tenant=tenant, external_id=external_id)
        .values_list("pk", "opted_in")
        .first()
    )
    end_users_observe(
        tenant,
        observations=[(external_id, opted_in)],
        source=source,
        actor=actor,
        default=opted_in,
        known={external_id: row} if row is not None else None,
    )
    user = EndUser.objects.get(tenant=tenant, external_id=external_id)
    audit_record(
        tenant,
        actor=actor,
        action="end_user.opt_in" if opted_in else "end_user.opt_out",
        target_type="end_user",
        target_id=str(user.pk),
        data={"source": source},
    )
    return user


def _check_external_id(external_id: Any, field_name: str = "end_user_id") -> str:
    return end_user_id_check(external_id, field_name=field_name)


@dataclass
class ImportResult:
    index: int
    status: str  # "opted_in", "opted_out" or "rejected"
    end_user_id: str | None = None
    error: dict[str, str] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "status": self.status}
        if self.end_user_id is not None:
            out["end_user_id"] = self.end_user_id
        if self.error is not None:
            out["error"] = self.error
        return out


MAX_IMPORT_ITEMS = 10_000


def end_users_import(tenant: Tenant, *, items: Sequence[Any], actor: str) -> list[ImportResult]:
    """Set the consent of many end users, each item judged alone (answered 207)."""
    if len(items) > MAX_IMPORT_ITEMS:
        raise PayloadTooLarge(f"items: at most {MAX_IMPORT_ITEMS} per import, got {len(items)}; split it")
    results: list[ImportResult] = []
    valid: list[tuple[str, bool]] = []
    for index, item in enumerate(items):
        try:
            if not isinstance(item, dict) or set(item) - {"end_user_id", "opted_in"}:
                raise ValidationFailed('item: must be {"end_user_id": ..., "opted_in": true|false}')
            external_id = _check_external_id(item.get("end_user_id"))
            if not isinstance(item.get("opted_in"), bool):
                raise ValidationFailed("opted_in: must be true or false")
        except ValidationFailed as exc:
            field_name = exc.message.split(":", 1)[0]
            results.append(
                ImportResult(index, "rejected", error={"code": "invalid", "message": exc.message, "field": field_name})
            )
            continue
        valid.append((external_id, item["opted_in"]))
        results.append(ImportResult(index, "opted_in" if item["opted_in"] else "opted_out", external_id))
    if valid:
        with transaction.atomic():
            end_users_observe(
                tenant, observations=valid, source=ConsentChange.Source.IMPORT, actor=actor, default=False
            )
            audit_record(
                tenant,
                actor=actor,
                action="end_user.import",
                target_type="end_user",
                target_id="*",
                data={"items": len(valid)},
            )
    return results
