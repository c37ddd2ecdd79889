"""Per-user sums of an adapter's traffic outside experiments: its holdout against the rest of the
opted-in users, and a promoted version against the holdout or the version before it.

The same definitions as ``arm_data`` (a shown suggestion is a non-empty completion the user saw;
the reward is the adapter's reward policy), plus the characters of the suggestions shown, for
the alarms on suggestion length. Another metric joins the alarms by registering its per-user
column here (``alarm_column_register``), as retained characters per request does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
from django.db.models import Aggregate, Count, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Length
from django.utils import timezone

from apps.adapters.models import Adapter
from apps.experiments.assignment import HOLDOUT, in_holdout
from apps.experiments.stats import ArmData
from apps.interactions.models import SHOWN_OUTCOMES, Feedback, Interaction, PersistenceReport
from apps.interactions.rewards import reward_expression, reward_table_for

_SHOWN = ~Q(completion="") & Q(feedback__outcome__in=SHOWN_OUTCOMES)
# Extra per-user columns the alarms may use: name -> the aggregate over one user's interactions.
_EXTRA_COLUMNS: dict[str, Callable[[], Aggregate]] = {}

RETAINED_SETTLE = timedelta(minutes=11)
"""A request counts for retained characters once its last checkpoint (the SDK tracker's is 10
minutes after the accept) has had a minute to arrive: the newest requests, not reported yet, would
read as code deleted, and a version just promoted has only new requests."""


def _settled() -> Q:
    return Q(served_at__lte=timezone.now() - RETAINED_SETTLE)


def _retained_chars() -> Aggregate:
    """A user's retained characters: each settled request's at its latest checkpoint reported (as
    the experiments count them, ``apps.experiments.retained``); a request with no report keeps 0."""
    latest = (
        PersistenceReport.objects.filter(interaction=OuterRef("pk"), retained_chars__isnull=False)
        .order_by("-checkpoint_s")
        .values("retained_chars")[:1]
    )
    return Sum(Subquery(latest), filter=_settled())


def alarm_column_register(name: str, aggregate: Callable[[], Aggregate]) -> None:
    """Make ``name`` a per-user column of ``UserSums`` (an aggregate over a user's interactions),
    for an alarm metric to use as numerator or denominator (``alarms.ALARM_METRICS``)."""
    _EXTRA_COLUMNS[name] = aggregate


# Retained characters per request's alarm: its numerator and denominator.
alarm_column_register("settled_requests", lambda: Count("id", filter=_settled()))
alarm_column_register("retained_chars", _retained_chars)


@dataclass(frozen=True)
class UserSums:
    """One row per end user; ``columns[name][i]`` is user ``users[i]``'s sum."""

    users: list[str]
    columns: dict[str, np.ndarray]

    def subset(self, keep: Iterable[bool]) -> UserSums:
        mask = np.fromiter(keep, dtype=bool, count=len(self.users))
        return UserSums(
            [u for u, k in zip(self.users, mask, strict=True) if k], {c: v[mask] for c, v in self.columns.items()}
        )

    def arm(self) -> ArmData:
        n = len(self.users)
        c = self.columns
        return ArmData(
            requests=c["requests"],
            shown=c["shown"],
            accepted=c["accepted"],
            reward_sum=c["reward_sum"],
            errors=np.zeros(n),
            slow_requests=np.zeros(n),
        )


def adapter_traffic(adapter: Adapter) -> QuerySet[Interaction]:
    """The adapter's traffic of opted-in users outside any experiment."""
    return Interaction.objects.filter(
        tenant_id=adapter.tenant_id, adapter=adapter, experiment__isnull=True, end_user_opted_in=True
    ).exclude(end_user_id="")


def user_sums(adapter: Adapter, interactions: QuerySet[Interaction]) -> UserSums:
    """Per-user sums of ``interactions`` in one grouped query."""
    aggregates: dict[str, Aggregate] = {
        "requests": Count("id"),
        "shown": Count("id", filter=_SHOWN),
        "accepted": Count("id", filter=~Q(completion="") & Q(feedback__outcome=Feedback.Outcome.ACCEPTED)),
        "reward_sum": Sum(reward_expression(reward_table_for(adapter))),  # type: ignore[arg-type]
        "shown_chars": Sum(Length("completion"), filter=_SHOWN),
        **{name: make() for name, make in _EXTRA_COLUMNS.items()},
    }
    rows: list[Any] = list(interactions.values("end_user_id").annotate(**aggregates).order_by("end_user_id"))
    return UserSums(
        users=[row["end_user_id"] for row in rows],
        columns={name: np.array([float(row[name] or 0) for row in rows]) for name in aggregates},
    )


def holdout_and_lineage(adapter: Adapter, interactions: QuerySet[Interaction]) -> tuple[UserSums, UserSums]:
    """(the holdout's users on the base model, everyone else on production) among
    ``interactions``: served holdout traffic records its arm; a user outside the holdout's hash
    never counts for it, and one inside it never counts for the lineage (their traffic from before
    the holdout existed, or logged without an arm)."""
    holdout = user_sums(adapter, interactions.filter(experiment_arm=HOLDOUT))
    lineage = user_sums(adapter, interactions.filter(experiment_arm=""))
    share, pk = adapter.holdout_share, adapter.pk
    return (
        holdout.subset(in_holdout(adapter_id=pk, share=share, external_id=u) for u in holdout.users),
        lineage.subset(not in_holdout(adapter_id=pk, share=share, external_id=u) for u in lineage.users),
    )
