"""Erasing an end user: every row Strop holds about them, in every app, in one transaction, and
the training runs and versions that learned from them marked first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from apps.cohorts.erased import erased_ids_record
from apps.cohorts.models import ConsentChange, EndUser
from apps.common.exceptions import NotFound
from apps.common.lookups import in_values
from apps.experiments.models import ExperimentExposure
from apps.interactions.models import (
    ConversationOutcome,
    Feedback,
    Interaction,
    PersistenceReport,
    ServingFailure,
    StreamPart,
)
from apps.interactions.selectors import stream_open_ids_of_user
from apps.privacy.deletion import rows_delete
from apps.privacy.purge import erased_user_remains
from apps.privacy.selectors import pending_keys, versions_touched_by
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record
from apps.training.erasure import training_erasure_record


@dataclass
class EraseReport:
    """What an erase removed, per table, and the versions whose training used the user's events."""

    deleted: dict[str, int] = field(default_factory=dict)
    versions_trained_on: list[dict[str, Any]] = field(default_factory=list)
    versions_evaluated_on: list[dict[str, Any]] = field(default_factory=list)
    # Every training run whose window held the user, active ones included (those are discarded and
    # rerun without them), and how to retrain the lineages whose versions learned from them.
    training_runs: list[dict[str, Any]] = field(default_factory=list)
    retrain: list[dict[str, str]] = field(default_factory=list)
    # What still holds something learned from the user, and until when (weights, caches, backups).
    remains: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "deleted": self.deleted,
            "versions_trained_on": self.versions_trained_on,
            "versions_evaluated_on": self.versions_evaluated_on,
            "training_runs": self.training_runs,
            "retrain": self.retrain,
            "remains": self.remains,
        }


@transaction.atomic
def end_user_erase(tenant: Tenant, *, external_id: str, actor: str) -> EraseReport:
    """Delete everything Strop holds about one end user, and say which versions learned from them.

    Interactions, their feedback and persistence reports, feedback and reports still waiting for
    them, serving failures, experiment exposures and consent history go; the audit row records that
    an erase happened, with the counts, never the erased data. A model version trained on their events is not retrained:
    the report names those versions, and says what remains and until when (``remains``: their
    weights until purged, once replaced, with ``adapter_version_purge``; caches; backups).
    """
    user = EndUser.objects.select_for_update().filter(tenant=tenant, external_id=external_id).first()
    # Their open streams' parts first, as a stream's end and the sweeper lock them before its
    # interaction and feedback (the same order: no deadlock). One the sweeper recorded meanwhile is an
    # interaction by the time the queries below run, and goes with the others. Feedback waits under
    # these ids too (apps.interactions.stream_parts). A stream still being served is not stopped: its
    # end records its interaction whole after this erase (as a request served after it would be),
    # and parts it writes after it (the sweeper's, if its worker dies) hold no first part unless it
    # had written none yet; erasing again once it has ended removes what it recorded.
    open_streams = stream_open_ids_of_user(tenant, end_user_id=external_id)
    StreamPart.objects.filter(tenant=tenant, interaction_id__in=open_streams).delete()
    interactions = Interaction.objects.filter(tenant=tenant, end_user_id=external_id)
    failures = ServingFailure.objects.filter(tenant=tenant, end_user_id=external_id)
    # Nothing left of them: not even a failure recorded for a request that read them before an erase.
    if user is None and not open_streams and not interactions.exists() and not failures.exists():
        raise NotFound(f"no end user {external_id[:200]!r}")
    report = EraseReport()
    report.versions_trained_on, report.versions_evaluated_on = versions_touched_by(interactions)
    # Marked before the rows go (the marks outlive them); an active run's mark discards it.
    erased_runs = training_erasure_record(tenant, interactions=interactions, external_id=external_id)
    report.training_runs, report.retrain = erased_runs.runs, erased_runs.retrain
    report.remains = erased_user_remains(tenant, trained_on=report.versions_trained_on)
    # One read of their interactions for both what is deleted and the client ids remembered as erased:
    # one recorded meanwhile stays whole (as one recorded just after would), never deleted unremembered.
    snapshot = list(interactions.values_list("pk", "client_id"))
    client_ids = pending_keys((c for _, c in snapshot), failures=failures, open_streams=open_streams)
    conversations = interactions.exclude(conversation_id="").values_list("conversation_id", flat=True)
    conversation_ids = list(conversations.distinct())
    if conversation_ids:
        # Their sessions' outcomes are locked before the turns' feedback goes, in the order recording
        # an outcome takes them (the outcome, then its turns' feedback: apps.interactions.sessions);
        # deleting the feedback first deadlocked with an outcome sent meanwhile.
        list(
            ConversationOutcome.objects.select_for_update()
            .filter(tenant=tenant, **in_values("conversation_id", conversation_ids))
            .order_by("pk")
            .values_list("pk")
        )
    # Their interactions locked before what hangs off them is read (after the outcomes, in the order
    # a session's spread takes them): a label holds its interaction while it writes
    # (apps.interactions.rows.interactions_held), so one written meanwhile has committed now and goes
    # with the rest, or it waits for this erase and finds the interaction gone; never a label left on
    # a deleted interaction, which failed this erase (or the label's batch) at commit.
    keys = [pk for pk, _ in snapshot]
    if keys:
        locked = Interaction.objects.filter(tenant=tenant, **in_values("pk", keys)).select_for_update()
        list(locked.order_by("pk").values_list("pk"))
    # Labels sent late for what goes now would wait for it as pending, out of any erase's reach.
    erased_ids_record(tenant.pk, client_ids=client_ids, conversation_ids=conversation_ids)
    # Their interactions with what cascades (feedback, persistence reports, training events), set-wise
    # (apps.privacy.deletion): a heavy user's tens of thousands of rows are never loaded.
    deleted = rows_delete(interactions, keys=keys)
    report.deleted["feedback"] = deleted["interactions.Feedback"]
    # A session's outcome goes with the user's turns, unless another user's turns share the session
    # (a tenant's ids reused across users): it is theirs too, spread to their turns.
    shared = set(
        Interaction.objects.filter(tenant=tenant, turn__isnull=False, **in_values("conversation_id", conversation_ids))
        .exclude(conversation_id="")  # lets the planner use the partial index on sessions' turns
        .exclude(end_user_id=external_id)  # a turn of theirs recorded during this erase is not another's
        .values_list("conversation_id", flat=True)
        .distinct()
        if conversation_ids
        else ()
    )
    own_sessions = [c for c in conversation_ids if c not in shared]
    session_outcomes = (
        ConversationOutcome.objects.filter(tenant=tenant, **in_values("conversation_id", own_sessions)).delete()[0]
        if own_sessions
        else 0
    )
    report.deleted["pending_feedback"] = (
        Feedback.objects.filter(tenant=tenant, **in_values("pending_client_id", client_ids)).delete()[0]
        if client_ids
        else 0
    )
    persistence_reports = deleted["interactions.PersistenceReport"]
    pending_persistence_reports = (
        PersistenceReport.objects.filter(tenant=tenant, **in_values("pending_client_id", client_ids)).delete()[0]
        if client_ids
        else 0
    )
    report.deleted["interactions"] = deleted["interactions.Interaction"]
    report.deleted["session_outcomes"] = session_outcomes
    report.deleted["persistence_reports"] = persistence_reports
    report.deleted["pending_persistence_reports"] = pending_persistence_reports
    report.deleted["serving_failures"] = failures.delete()[0]
    if user is not None:
        report.deleted["exposures"] = ExperimentExposure.objects.filter(end_user=user).delete()[0]
        report.deleted["consent_history"] = ConsentChange.objects.filter(end_user=user).delete()[0]
        user.delete()
        report.deleted["end_users"] = 1
    else:
        report.deleted.update(exposures=0, consent_history=0, end_users=0)
    audit_record(
        tenant,
        actor=actor,
        action="end_user.erase",
        target_type="end_user",
        target_id="erased",
        data={
            "deleted": report.deleted,
            "versions_trained_on": [v["vllm_name"] for v in report.versions_trained_on],
            "training_runs": [r["run"] for r in report.training_runs],
        },
    )
    return report
