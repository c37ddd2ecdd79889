"""Which labelled events a run may learn from.

The rule: a run trains a new version from ``parent`` on every labelled, opted-in event of the
adapter that no run in ``parent``'s lineage has trained on, less the events of rejected runs a
person left out of training. It is a set difference, not a watermark, so an event committed late
(a slow transaction, feedback that arrived before its interaction) is never skipped, and none is
trained on twice in one lineage.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Case, Count, Exists, OuterRef, Q, QuerySet, When

from apps.adapters.models import Adapter, AdapterVersion
from apps.cohorts.selectors import consented_events
from apps.common.exceptions import NotFound
from apps.common.parsing import parse_id
from apps.interactions.models import Feedback, Interaction
from apps.tenants.models import Tenant
from apps.training.models import EvalSet, TrainingPolicy, TrainingRun, TrainingRunEvent

GOOD_VERSION_STATUSES = (
    AdapterVersion.Status.CANDIDATE,
    AdapterVersion.Status.IN_EXPERIMENT,
    AdapterVersion.Status.PRODUCTION,
)


def adapter_lineage_head(adapter: Adapter) -> AdapterVersion | None:
    """The version the next run trains from: the newest one still fit to serve (None = base)."""
    return adapter.versions.filter(status__in=GOOD_VERSION_STATUSES).order_by("-number").first()


def version_lineage_ids(version: AdapterVersion | None) -> list[int]:
    """``version`` and its ancestors, newest first, in one query whatever the lineage's depth (a
    version's parent is always a version of the same adapter)."""
    if version is None:
        return []
    parents = dict(AdapterVersion.objects.filter(adapter_id=version.adapter_id).values_list("id", "parent_id"))
    ids: list[int] = []
    current: int | None = version.pk
    while current is not None and current not in ids:
        ids.append(current)
        current = parents.get(current)
    return ids


def _belongs_to_adapter(adapter: Adapter, *, via: str = "interaction__") -> Q:
    """Served interactions name their adapter; logged ones may name it in `model`, else go to the default.

    ``via`` is the path to the interaction: ``interaction__`` from Feedback, empty from Interaction."""
    match = Q(**{f"{via}adapter": adapter}) | Q(**{f"{via}adapter__isnull": True, f"{via}model_name": adapter.name})
    if adapter.is_default:
        other_names = Adapter.objects.filter(tenant_id=adapter.tenant_id).exclude(pk=adapter.pk).values("name")
        match |= Q(**{f"{via}adapter__isnull": True}) & ~Q(**{f"{via}model_name__in": other_names})
    return match


def interaction_belongs_to_adapter(adapter: Adapter) -> Q:
    """The same attribution rule as training's, as a filter on Interaction (the dashboard's figures)."""
    return _belongs_to_adapter(adapter, via="")


def feedback_belongs_to_adapter(adapter: Adapter) -> Q:
    return _belongs_to_adapter(adapter)


def interaction_adapter(interaction: Interaction, *, adapters: Sequence[Adapter]) -> Adapter | None:
    """Which of the tenant's ``adapters`` the interaction counts for, by the attribution rule (one
    query, however many adapters): the adapter whose figures, training and reward policy it is in."""
    if not adapters:
        return None
    matches = (
        Interaction.objects.filter(pk=interaction.pk)
        .annotate(
            **{
                f"of_{index}": Case(When(interaction_belongs_to_adapter(adapter), then=True), default=False)
                for index, adapter in enumerate(adapters)
            }
        )
        .values_list(*(f"of_{index}" for index in range(len(adapters))))
        .first()
    )
    return next((adapter for adapter, match in zip(adapters, matches or (), strict=False) if match), None)


def training_events_eligible(adapter: Adapter, *, parent: AdapterVersion | None) -> QuerySet[Feedback]:
    """Labelled events the consent rule allows (apps.cohorts.selectors) not yet learned in the lineage
    and not left out of training."""
    return _not_learned(adapter, parent).exclude(_left_out(adapter))


def _left_out(adapter: Adapter) -> Exists:
    """The event is in a rejected run whose events a person left out of training
    (``training_window_exclude``), or no sample could be built from it (its data: a run left it out,
    ``apps.training.dataset``): of any of the tenant's adapters, so an event whose attribution moves
    to another adapter stays out too."""
    return Exists(
        TrainingRunEvent.objects.filter(feedback_id=OuterRef("pk"), run__tenant_id=adapter.tenant_id).filter(
            Q(run__window_excluded_at__isnull=False) | Q(left_out=True)
        )
    )


def _not_learned(adapter: Adapter, parent: AdapterVersion | None) -> QuerySet[Feedback]:
    """Labelled, consented, learnable events of the adapter that no version of ``parent``'s lineage learned."""
    # NOT EXISTS (a probe of the (feedback, held_out) index per event), not NOT IN: the lineage's
    # trained events are not read whole for each query (a window's walk runs several). Learned with
    # the label it has now: one whose outcome changed since is learned again.
    trained_in_lineage = TrainingRunEvent.objects.filter(
        Q(outcome=OuterRef("outcome")) | Q(outcome=""),
        feedback_id=OuterRef("pk"),
        run__output_version_id__in=version_lineage_ids(parent),
        held_out=False,
    )
    consented = (
        Feedback.objects.filter(tenant_id=adapter.tenant_id, interaction__isnull=False)
        .filter(consented_events("interaction__"))
        .filter(_belongs_to_adapter(adapter))
    )
    return feedback_learnable(consented).exclude(Exists(trained_in_lineage))


def training_events_left_out(adapter: Adapter, *, parent: AdapterVersion | None) -> QuerySet[Feedback]:
    """Events that would be eligible but for a person leaving them out of training."""
    return _not_learned(adapter, parent).filter(_left_out(adapter))


WINDOW_STEP = 20_000  # the tenant's events read per step of a window's walk


def training_window_events(adapter: Adapter, *, parent: AdapterVersion | None, limit: int | None) -> list[Feedback]:
    """The oldest ``limit`` eligible events (by id; all of them with no limit), each with its
    interaction and persistence reports. The tenant's events are walked by the ``(tenant, id)`` index
    in steps of ``WINDOW_STEP`` ids, each step filtered by the eligibility rule, until the window is
    full: its cost follows the window's size, not the tenant's history (one query over every
    eligible event would be sorted whole before the first ``limit`` are taken)."""
    eligible = (
        training_events_eligible(adapter, parent=parent)
        .select_related("interaction")
        .prefetch_related("interaction__persistence_reports")
        .order_by("id")
    )
    if limit is None:
        return list(eligible)
    ids = Feedback.objects.filter(tenant_id=adapter.tenant_id).order_by("id").values_list("id", flat=True)
    events: list[Feedback] = []
    after = 0
    while len(events) < limit:
        upper = ids.filter(id__gt=after)[WINDOW_STEP - 1 : WINDOW_STEP].first()
        step = eligible.filter(id__gt=after) if upper is None else eligible.filter(id__gt=after, id__lte=upper)
        events.extend(step[: limit - len(events)])
        if upper is None:
            break
        after = upper
    return events


def feedback_learnable(feedback: QuerySet[Feedback]) -> QuerySet[Feedback]:
    """The events of ``feedback`` that say something about a suggestion the user saw."""
    return (
        # Nothing to learn from an event without a prompt or conversation (an editor's noCode outcome).
        # Empty prompt ids are none (ingest refuses them now; rows stored before may hold them).
        feedback.exclude(
            Q(interaction__prompt="", interaction__prefix="", interaction__messages__isnull=True)
            & (Q(interaction__prompt_token_ids__isnull=True) | Q(interaction__prompt_token_ids=b""))
        )
        # A suggestion the show filter withheld was never seen: its reward says nothing of it. (Not an
        # exclude of the key: it is NULL where the key is missing, and excluding NULL drops the row.)
        .filter(Q(interaction__metadata__show_gate__isnull=True) | Q(interaction__metadata__show_gate__withheld=False))
        # A partial interaction (the sweeper recorded a stream whose worker died: apps.interactions.
        # stream_parts) holds only what was written before; its feedback judged the whole text the
        # user saw (accepted, edited, accepted_chars, kept_text), so it would teach the wrong thing.
        .filter(Q(interaction__metadata__partial__isnull=True) | Q(interaction__metadata__partial=False))
    )


def training_events_new(
    adapter: Adapter, *, parent: AdapterVersion | None, limit: int | None = None
) -> QuerySet[Feedback]:
    """Eligible events of the next window (its oldest ``limit``: ``TRAINING_MAX_WINDOW_EVENTS``)
    that no run from this parent has looked at yet: what makes a new run worth it.

    A rejected or failed run from the same parent does not consume its events (the next
    successful run still learns them) but they do not trigger a run again on their own; nor do
    events past the next window, which a run would not take: a window already tried from this
    parent stays as it was however many events wait behind it, and starting a run on it would
    only end the same way again (a person leaves a rejected window out of training, or starts a
    run by hand). With ``limit`` None, every unseen eligible event counts.
    """
    seen = TrainingRunEvent.objects.filter(run__adapter=adapter, run__parent_version=parent).values("feedback_id")
    eligible = training_events_eligible(adapter, parent=parent)
    new = eligible.exclude(id__in=seen)
    if limit is None:
        return new
    counts = eligible.aggregate(total=Count("id"), seen=Count("id", filter=Q(id__in=seen)))
    if not counts["seen"] or counts["total"] <= limit:
        return new  # the next window is all new events, or takes every eligible one
    # The newest id the window takes: ids only, so one top-``limit`` pass over the eligible events
    # (the cost of the count above), not the window's rows.
    last = eligible.order_by("id").values_list("id", flat=True)[limit - 1 : limit].first()
    return new if last is None else new.filter(id__lte=last)


def eval_set_get(adapter: Adapter) -> EvalSet | None:
    """The adapter's FIM eval set, None until one is uploaded."""
    return EvalSet.objects.filter(adapter=adapter).first()


def training_policy_get(adapter: Adapter) -> TrainingPolicy:
    policy = TrainingPolicy.objects.filter(adapter=adapter).first()
    return policy if policy is not None else TrainingPolicy(tenant_id=adapter.tenant_id, adapter=adapter)


def training_policy_reward_table(adapter: Adapter) -> dict[str, float]:
    """What each feedback outcome is worth on ``adapter`` (``apps.interactions.rewards``)."""
    return training_policy_get(adapter).reward_table()


def training_run_list(tenant: Tenant, *, adapter: Adapter | None = None) -> QuerySet[TrainingRun]:
    qs = (
        TrainingRun.objects.filter(tenant=tenant)
        .select_related("adapter", "parent_version", "output_version")
        .prefetch_related("erasures")
    )
    if adapter is not None:
        qs = qs.filter(adapter=adapter)
    return qs.order_by("-created_at", "-id")


def training_run_get_for_tenant(tenant: Tenant, *, run_id: int | str) -> TrainingRun:
    try:
        return training_run_list(tenant).get(pk=parse_id(run_id, what="training run"))
    except TrainingRun.DoesNotExist:
        raise NotFound(f"training run {run_id} not found") from None


def training_run_counts() -> dict[str, int]:
    """Training runs per state, across tenants (for operators)."""
    return dict(TrainingRun.objects.values_list("status").annotate(count=Count("id")).order_by())
