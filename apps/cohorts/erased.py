"""The ids an erase removed, kept a while as keyed digests, so late labels cannot bring data back.

Feedback, persistence reports and session outcomes may arrive before what they label, and then
wait as pending rows (with the user's kept text or document). Sent after an erase, for an
interaction or a session the erase removed, such a label would wait forever under an id no later
erase can find: no interaction and no end user name it any more. So the erase records the client
ids (and open streams' ids) and conversation ids it removed, and a label that would wait for one of
them is refused ("erased"). A label for an interaction or session that exists again (a session the
user went on with after the erase: new data, a new end user row) is taken as usual.

Only a digest is kept: HMAC-SHA256 under ``ERASURE_MARK_KEY`` (as the training runs' erasure marks)
of the tenant, the kind and the id, so the table says nothing of the ids themselves. The rows are
dropped after ``ERASED_IDS_KEPT`` by the hourly retention pass: labels come seconds to minutes after
their interaction (the persistence checkpoints end at 10 minutes), not weeks.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Literal

from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.cohorts.models import ErasedId
from apps.common.exceptions import ApplicationError
from apps.common.lookups import in_values

ERASED_IDS_KEPT = timedelta(days=30)

Kind = Literal["client", "conversation"]

_BATCH = 5000


class Erased(ApplicationError):
    """A label for an interaction or session an erase removed (410): it is not kept."""

    status_code = 410
    code = "erased"


def erasure_hmac(message: str) -> str:
    """HMAC-SHA256 under ``ERASURE_MARK_KEY``, in hex: what erasure keeps instead of an id (these
    digests, and the training runs' marks of an erased user)."""
    return hmac.new(settings.ERASURE_MARK_KEY.encode(), message.encode(), hashlib.sha256).hexdigest()


def erased_digest(tenant_id: int, kind: Kind, value: str) -> str:
    return erasure_hmac(f"{tenant_id}:{kind}:{value}")[:32]


def erased_ids_record(
    tenant_id: int, *, client_ids: Iterable[str], conversation_ids: Iterable[str], now: datetime | None = None
) -> int:
    """Remember the ids an erase removed (in the erase's transaction), from ``now`` (an id erased
    again is kept ``ERASED_IDS_KEPT`` from the later erase). Returns how many ids it wrote."""
    erased_at = now or timezone.now()
    digests = {erased_digest(tenant_id, "client", c) for c in client_ids if c}
    digests |= {erased_digest(tenant_id, "conversation", c) for c in conversation_ids if c}
    if not digests:
        return 0
    ordered = sorted(digests)  # two erases of one tenant write their rows in the same order
    if connection.vendor == "postgresql":  # one statement, however many: a heavy user has tens of thousands
        table = connection.ops.quote_name(ErasedId._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (tenant_id, digest, erased_at) SELECT %s, d, %s FROM unnest(%s::text[]) AS d "
                "ON CONFLICT (tenant_id, digest) DO UPDATE SET erased_at = EXCLUDED.erased_at",
                [tenant_id, erased_at, ordered],
            )
        return len(ordered)
    rows = [ErasedId(tenant_id=tenant_id, digest=d, erased_at=erased_at) for d in ordered]
    ErasedId.objects.bulk_create(
        rows, batch_size=_BATCH, update_conflicts=True, unique_fields=["tenant", "digest"], update_fields=["erased_at"]
    )
    return len(rows)


def erased_among(tenant_id: int, kind: Kind, values: Iterable[str]) -> set[str]:
    """Which of ``values`` an erase removed within ``ERASED_IDS_KEPT``; one query, none for no values."""
    by_digest = {erased_digest(tenant_id, kind, v): v for v in values if v}
    if not by_digest:
        return set()
    found = ErasedId.objects.filter(tenant_id=tenant_id, **in_values("digest", by_digest)).values_list(
        "digest", flat=True
    )
    return {by_digest[d] for d in found}


def erased_ids_expire(*, now: datetime | None = None) -> int:
    """Drop the digests older than ``ERASED_IDS_KEPT``; how many went."""
    cutoff = (now or timezone.now()) - ERASED_IDS_KEPT
    return ErasedId.objects.filter(erased_at__lt=cutoff).delete()[0]


def erased_label_error(field: str, value: str) -> dict[str, str]:
    """The verdict of a label for an interaction or session an erase removed."""
    what = "session" if field == "conversation_id" else "interaction"
    return {
        "code": "erased",
        "message": f"{field}: the {what} {value[:200]!r} was erased with its end user; labels on it are not kept",
        "field": field,
    }
