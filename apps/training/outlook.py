"""Why an adapter is, or is not, training: what its feedback counts for, and when the next run starts.

Every interaction attributed to the adapter (the training rule: ``feedback_belongs_to_adapter``)
falls in exactly one bucket, checked in this order: no feedback yet; feedback whose end user did
not consent (then, or now: ``apps.cohorts.selectors.consented_events``); nothing to learn from
(no prompt, or a suggestion the show filter withheld); already learned by the current lineage;
left out of training by a person (a rejected run's events: ``training_window_exclude``);
already seen by a run from the current parent (it trains again with the next successful run,
but does not start one), or not yet seen but past the next window (``TRAINING_MAX_WINDOW_EVENTS``
of the oldest) while that window is one a run from this parent already tried; new: counted
against the policy's ``min_new_events``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Min

from apps.adapters.models import Adapter, AdapterVersion
from apps.cohorts.selectors import consented_events
from apps.interactions.models import Feedback, Interaction
from apps.training.models import ACTIVE_STATUSES, TrainingPolicy, TrainingRun
from apps.training.selectors import (
    adapter_lineage_head,
    feedback_belongs_to_adapter,
    feedback_learnable,
    interaction_belongs_to_adapter,
    training_events_eligible,
    training_events_left_out,
    training_events_new,
    training_policy_get,
)


@dataclass(frozen=True)
class TrainingOutlook:
    adapter: Adapter
    policy: TrainingPolicy
    parent: AdapterVersion | None
    interactions: int
    no_feedback: int
    no_consent: int
    nothing_to_learn: int
    already_trained: int
    left_out: int
    seen_from_parent: int  # and those waiting behind a window already tried (``waiting_behind``)
    new: int
    oldest_new_at: datetime | None
    active_run: TrainingRun | None
    tenant_runs_active: int
    tenant_run_cap: int
    waiting_behind: int  # never seen, but past a next window a run from this parent already tried

    @property
    def due_at(self) -> datetime | None:
        """When the waiting events are due by age (``max_wait_s`` after the oldest), if any wait."""
        if self.oldest_new_at is None:
            return None
        return self.oldest_new_at + timedelta(seconds=self.policy.max_wait_s)

    @property
    def events_short(self) -> int:
        return max(0, self.policy.min_new_events - self.new)

    @property
    def verdict(self) -> str:
        """One sentence: what is happening, or what the next run waits for."""
        if self.active_run is not None:
            return f"Run #{self.active_run.pk} is {self.active_run.status}."
        if not self.policy.enabled:
            return "Automatic training is off in this adapter's training policy; start a run by hand."
        if self.tenant_runs_active >= self.tenant_run_cap:
            return (
                f"The tenant already runs {self.tenant_runs_active} of its {self.tenant_run_cap} concurrent "
                "training runs; the next starts when one ends."
            )
        if self.new >= self.policy.min_new_events:
            return f"{self.new} new events are enough: a run starts at the scheduler's next check (within seconds)."
        if not self.new and self.waiting_behind:
            return (
                f"{self.waiting_behind} new events wait behind the oldest {settings.TRAINING_MAX_WINDOW_EVENTS}, "
                "which a run from this version already tried (rejected or failed): they start no run until "
                "a person leaves that run's events out of training, or starts a run by hand."
            )
        if self.new:
            return (
                f"{self.new} new events of the {self.policy.min_new_events} that start a run; "
                f"{self.events_short} more, or the oldest waiting {self.policy.max_wait_s} s, starts one."
            )
        return "No new events to learn from: a run starts once opted-in users' feedback arrives."


def training_outlook(adapter: Adapter) -> TrainingOutlook:
    """The buckets of the adapter's interactions and the scheduler's view, in a handful of queries."""
    policy = training_policy_get(adapter)
    parent = adapter_lineage_head(adapter)
    interactions = Interaction.objects.filter(tenant_id=adapter.tenant_id).filter(
        interaction_belongs_to_adapter(adapter)
    )
    counted = interactions.aggregate(total=Count("id"), with_feedback=Count("feedback"))
    feedback = Feedback.objects.filter(tenant_id=adapter.tenant_id, interaction__isnull=False).filter(
        feedback_belongs_to_adapter(adapter)
    )
    consent = consented_events("interaction__")
    split = feedback.aggregate(total=Count("id"), consented=Count("id", filter=consent))
    eligible = training_events_eligible(adapter, parent=parent)
    window_new = training_events_new(adapter, parent=parent, limit=settings.TRAINING_MAX_WINDOW_EVENTS)
    new = window_new.aggregate(count=Count("id"), oldest=Min("updated_at"))
    unseen = training_events_new(adapter, parent=parent).count()
    unlearned = eligible.count()
    left_out = training_events_left_out(adapter, parent=parent).count()
    learnable = feedback_learnable(feedback.filter(consent)).count()
    active = TrainingRun.objects.filter(adapter=adapter, status__in=ACTIVE_STATUSES).order_by("-id").first()
    return TrainingOutlook(
        adapter=adapter,
        policy=policy,
        parent=parent,
        interactions=counted["total"],
        no_feedback=counted["total"] - counted["with_feedback"],
        no_consent=split["total"] - split["consented"],
        nothing_to_learn=split["consented"] - learnable,
        already_trained=learnable - unlearned - left_out,
        left_out=left_out,
        seen_from_parent=unlearned - new["count"],
        new=new["count"],
        oldest_new_at=new["oldest"],
        active_run=active,
        tenant_runs_active=TrainingRun.objects.filter(tenant_id=adapter.tenant_id, status__in=ACTIVE_STATUSES).count(),
        tenant_run_cap=adapter.tenant.max_concurrent_training_runs,
        waiting_behind=unseen - new["count"],
    )
