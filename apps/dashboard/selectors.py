"""Reads that only the dashboard needs: memberships, the lineage tree, a run's trainer curves,
filtered interaction and audit listings. Tenant-owned objects are resolved through the domain
``*_get_for_tenant`` selectors; everything here is scoped to the tenant it is given."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import BooleanField, ExpressionWrapper, F, Q, QuerySet

from apps.adapters.models import Adapter, AdapterVersion
from apps.interactions.models import Interaction
from apps.tenants.models import AuditEvent, Membership, Tenant
from apps.training.models import TrainingRun


def membership_list_for_user(user: Any) -> list[Membership]:
    """The tenants a dashboard user may see, with the role in each (one query)."""
    return list(Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__name", "tenant__slug"))


@dataclass
class VersionNode:
    """One version in its lineage: the run that made it, the gate's verdict, and its children."""

    version: AdapterVersion
    run: TrainingRun | None
    depth: int = 0
    children: list[VersionNode] = field(default_factory=list)

    @property
    def gate(self) -> dict[str, Any]:
        if self.run is not None and self.run.gate:
            return self.run.gate
        return self.version.metrics.get("gate") or {}

    @property
    def trainer(self) -> dict[str, Any]:
        if self.run is not None and self.run.trainer_summary:
            return self.run.trainer_summary
        return self.version.metrics.get("trainer") or {}


def adapter_lineage(tenant: Tenant, *, adapter: Adapter) -> list[VersionNode]:
    """The adapter's versions as a depth-first list (newest branch first), each with its depth (two queries)."""
    versions = list(AdapterVersion.objects.filter(tenant=tenant, adapter=adapter).order_by("-number"))
    runs = {
        run.output_version_id: run
        for run in TrainingRun.objects.filter(tenant=tenant, output_version__in=versions).defer("log")
    }
    nodes = {v.pk: VersionNode(version=v, run=runs.get(v.pk)) for v in versions}
    roots: list[VersionNode] = []
    for version in versions:  # newest first, so children lists are newest first too
        parent = nodes.get(version.parent_id) if version.parent_id else None
        if parent is not None:
            version.parent = parent.version  # fills the relation's cache: no query per version
        (parent.children if parent else roots).append(nodes[version.pk])
    ordered: list[VersionNode] = []

    def walk(node: VersionNode, depth: int) -> None:
        node.depth = depth
        ordered.append(node)
        for child in node.children:
            walk(child, depth + 1)

    for root in roots:
        walk(root, 0)
    return ordered


# The trainer's per-step rows: the curves the run page draws, in this order.
CURVES = (
    ("reward_mean", "Reward (batch mean)"),
    ("approx_kl", "Approx. KL"),
    ("clip_fraction", "Clip fraction"),
    ("loss", "Loss"),
    ("entropy", "Entropy"),
)
MAX_STEP_ROWS = 20_000


@dataclass(frozen=True)
class StepCurves:
    """Per-step trainer metrics read from the run's ``metrics.jsonl`` (empty when there is none)."""

    steps: list[dict[str, Any]]
    source: str | None
    skipped_lines: int = 0

    def series(self, name: str) -> list[tuple[float, float | None]]:
        points = []
        for index, row in enumerate(self.steps):
            value = row.get(name)
            finite = float(value) if isinstance(value, int | float) and math.isfinite(value) else None
            points.append((float(row.get("step", index)), finite))
        return points


def training_run_step_metrics(run: TrainingRun) -> StepCurves:
    """The trainer's per-step metrics, which the version's row keeps (``training_steps``); a run
    without an output version (failed, rejected, still going) has none."""
    version = run.output_version
    if version is None or not version.training_steps:
        return StepCurves(steps=[], source=None)
    steps = [row for row in version.training_steps[:MAX_STEP_ROWS] if isinstance(row, dict)]
    return StepCurves(steps=steps, source="metrics.jsonl", skipped_lines=len(version.training_steps) - len(steps))


NO_FEEDBACK = "none"


@dataclass(frozen=True)
class InteractionFilters:
    end_user_id: str = ""
    version_id: int | None = None
    outcome: str = ""
    since: datetime | None = None
    until: datetime | None = None


def interaction_search(tenant: Tenant, *, filters: InteractionFilters) -> QuerySet[Interaction]:
    """Newest first by when it was served (the ``(tenant, served_at)`` index, walked by keyset pages: see
    :func:`interaction_page`), with the version and the feedback outcome joined in; the large columns
    (prompt, token ids, logprobs) stay in the database until one interaction is opened."""
    qs = (
        Interaction.objects.filter(tenant=tenant)
        .select_related("adapter_version__adapter", "adapter")
        .annotate(
            outcome=F("feedback__outcome"),
            called_tools=ExpressionWrapper(Q(metadata__has_key="tool_calls"), output_field=BooleanField()),
        )
        .defer(
            "prompt",
            "suffix",
            "prompt_token_ids",
            "completion_token_ids",
            "completion_logprobs",
            "metadata",
            "messages",
            "tools",
        )
        .order_by("-served_at", "-id")
    )
    if filters.end_user_id:
        qs = qs.filter(end_user_id=filters.end_user_id)
    if filters.version_id is not None:
        qs = qs.filter(adapter_version_id=filters.version_id)
    if filters.outcome == NO_FEEDBACK:
        qs = qs.filter(feedback__isnull=True)
    elif filters.outcome:
        qs = qs.filter(feedback__outcome=filters.outcome)
    if filters.since is not None:
        qs = qs.filter(served_at__gte=filters.since)
    if filters.until is not None:
        qs = qs.filter(served_at__lte=filters.until)
    return qs


@dataclass(frozen=True)
class InteractionPage:
    """One keyset page: no count, no offset, so the hundredth page costs what the first does."""

    object_list: list[Interaction]
    older: str | None  # the cursor of the next (older) page, None on the last
    first: bool


def _cursor(interaction: Interaction) -> str:
    return f"{interaction.served_at.isoformat()}~{interaction.pk}"


def interaction_page(qs: QuerySet[Interaction], *, after: str | None, per_page: int) -> InteractionPage:
    """The ``per_page`` interactions of ``qs`` (ordered newest served first) older than the cursor
    ``after`` (a page's ``older``); an unreadable cursor gives the first page."""
    position = _cursor_parse(after)
    if position is not None:
        served_at, pk = position
        qs = qs.filter(Q(served_at__lt=served_at) | Q(served_at=served_at, id__lt=pk))
    rows = list(qs[: per_page + 1])
    older = _cursor(rows[per_page - 1]) if len(rows) > per_page else None
    return InteractionPage(object_list=rows[:per_page], older=older, first=position is None)


def _cursor_parse(after: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not after or "~" not in after:
        return None
    moment, _, pk = after.rpartition("~")
    try:
        served_at = datetime.fromisoformat(moment)
        if served_at.tzinfo is None:
            return None
        # In UTC, as the cursor was written: Python takes offsets Postgres refuses (+01:00:00.000001).
        return served_at.astimezone(UTC), uuid.UUID(pk)
    except (ValueError, OverflowError):  # OverflowError: an offset that moves it out of the years 1-9999
        return None


def version_choices(tenant: Tenant) -> list[tuple[int, str]]:
    """Every version of the tenant, labelled ``adapter vN``, for filters."""
    rows = (
        AdapterVersion.objects.filter(tenant=tenant)
        .order_by("adapter__name", "-number")
        .values_list("pk", "adapter__name", "number")
    )
    return [(pk, f"{name} v{number}") for pk, name, number in rows]


def audit_event_search(tenant: Tenant, *, action: str = "", actor: str = "") -> QuerySet[AuditEvent]:
    qs = AuditEvent.objects.filter(tenant=tenant).order_by("-created_at", "-id")
    if action:
        qs = qs.filter(action=action)
    if actor:
        qs = qs.filter(actor__icontains=actor)
    return qs


def audit_action_choices(tenant: Tenant) -> list[str]:
    return list(AuditEvent.objects.filter(tenant=tenant).order_by("action").values_list("action", flat=True).distinct())


def actor_labels(actors: set[str]) -> dict[str, str]:
    """``user:<id>`` reads better as the user's name: one query for all users on the page."""
    ids = {int(a.split(":", 1)[1]) for a in actors if a.startswith("user:") and a.split(":", 1)[1].isdigit()}
    if not ids:
        return {}
    names = get_user_model().objects.filter(pk__in=ids).values_list("pk", "username")
    return {f"user:{pk}": username for pk, username in names}


def tenant_has_traffic(tenant: Tenant) -> bool:
    """Whether any interaction of the tenant has arrived: until one has, the overview guides to it."""
    return Interaction.objects.filter(tenant=tenant).exists()


# How many of an adapter's latest interactions say whether it serves agents (chat) or editors.
RECENT_FOR_KIND = 200


def adapter_serves_agents(adapter: Adapter) -> bool:
    """Whether the adapter answers agents: one of its latest interactions is a chat (a conversation).
    Bounded: the newest few by the (tenant, received_at) index, never a scan of its history."""
    recent = (
        Interaction.objects.filter(tenant_id=adapter.tenant_id, adapter=adapter)
        .order_by("-received_at")
        .annotate(chat=ExpressionWrapper(Q(messages__isnull=False), output_field=BooleanField()))
        .values_list("chat", flat=True)[:RECENT_FOR_KIND]
    )
    return any(recent)
