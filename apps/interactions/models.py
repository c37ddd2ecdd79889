from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.interactions.ids import time_id
from apps.interactions.packed import PackedFloatsField, PackedIdsField
from apps.tenants.models import Tenant


class Interaction(models.Model):
    """One completion, served by Strop or logged by the tenant after serving it elsewhere.

    A completion answers either a prompt (or prefix + suffix) or a conversation: ``messages``
    (OpenAI's chat shape, up to the turn answered) and ``tools``; ``completion`` is then the
    assistant's text and ``metadata["tool_calls"]`` its tool calls. A conversation's turns share
    ``conversation_id`` and are ordered by ``turn``."""

    class Source(models.TextChoices):
        LOGGED = "logged"
        SERVED = "served"
        EDITOR = "editor"

    # Made from when it was served (apps.interactions.ids): ids sort by served time.
    id = models.UUIDField(primary_key=True, default=time_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    client_id = models.CharField(max_length=200, null=True, blank=True, help_text="the tenant's id; unique per tenant")
    source = models.CharField(max_length=16, choices=Source.choices)
    prompt = models.TextField(blank=True, help_text="the whole prompt, when the tenant sends one")
    prefix = models.TextField(blank=True)
    suffix = models.TextField(blank=True)
    messages = models.JSONField(null=True, blank=True, help_text="the conversation answered (chat), OpenAI's shape")
    tools = models.JSONField(null=True, blank=True, help_text="the tools offered to the model (chat)")
    conversation_id = models.CharField(max_length=200, blank=True, help_text="the tenant's id of the session")
    turn = models.PositiveIntegerField(null=True, blank=True, help_text="0-based index of this reply in its session")
    completion = models.TextField(blank=True, help_text="empty = the model chose to suggest nothing")
    # Packed (2 or 4 bytes an id after a width byte, 8 a logprob), not JSON: most of a served row's bytes (packed.py).
    prompt_token_ids = PackedIdsField(null=True, blank=True)
    completion_token_ids = PackedIdsField(null=True, blank=True)
    completion_logprobs = PackedFloatsField(
        null=True, blank=True, help_text="behaviour logprob of each completion token"
    )
    model_name = models.CharField(max_length=200, blank=True, help_text="model or adapter version that served it")
    adapter = models.ForeignKey(
        "adapters.Adapter",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="the tenant adapter the request named (served interactions; logged ones may name it in `model`)",
    )
    adapter_version = models.ForeignKey(
        "adapters.AdapterVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="the Strop adapter version that served it (empty: the base model, or served elsewhere)",
    )
    experiment = models.ForeignKey(
        "experiments.Experiment",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="the experiment that chose the version (opted-in users of a running experiment)",
    )
    experiment_arm = models.CharField(max_length=64, blank=True, help_text="the experiment arm that chose the version")
    end_user_id = models.CharField(max_length=200, blank=True, help_text="the tenant's external id of the end user")
    end_user_opted_in = models.BooleanField(default=False)
    served_at = models.DateTimeField()
    received_at = models.DateTimeField()
    latency_ms = models.FloatField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "client_id"],
                condition=Q(client_id__isnull=False),
                name="interaction_unique_client_id",
            )
        ]
        indexes = [
            models.Index(fields=["tenant", "received_at"]),
            # Rollups recompute hours by served_at; the interactions list walks it newest first.
            models.Index(fields=["tenant", "served_at", "id"], name="interaction_tenant_served"),
            # An end user's interactions, newest first (the end-user page); every lookup by user.
            models.Index(fields=["tenant", "end_user_id", "received_at"], name="interaction_tenant_user_recv"),
            models.Index(fields=["experiment", "end_user_id"]),
            models.Index(
                fields=["tenant", "conversation_id", "turn"],
                condition=~Q(conversation_id=""),
                name="interaction_conversation_turn",
            ),
        ]


class Feedback(models.Model):
    """The end user's verdict on one interaction: one row per interaction, last write wins.

    Feedback can arrive before its interaction (naming the tenant's client id): it is kept
    with ``pending_client_id`` set and attached when the interaction arrives.
    """

    class Outcome(models.TextChoices):
        ACCEPTED = "accepted"
        REJECTED = "rejected"
        NOT_SHOWN = "not_shown"
        EDITED = "edited"
        # The user took the first ``accepted_chars`` characters (an editor's word-by-word accept).
        PARTIAL = "partial"
        # Agents: what the user did with an answer (see docs/agents.md, "Agents").
        THUMBS_UP = "thumbs_up"
        THUMBS_DOWN = "thumbs_down"
        EDIT_PERSISTED = "edit_persisted"
        EDIT_REVERTED = "edit_reverted"
        FOLLOW_UP_DISSATISFIED = "follow_up_dissatisfied"
        TOOL_CALL_FAILED = "tool_call_failed"

    # No index of its own: the (tenant, id) one leads with it.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    interaction = models.ForeignKey(
        Interaction, null=True, blank=True, on_delete=models.CASCADE, related_name="feedback"
    )
    pending_client_id = models.CharField(max_length=200, null=True, blank=True)
    outcome = models.CharField(max_length=32, choices=Outcome.choices)
    reward_weight = models.FloatField(
        default=1.0, help_text="the outcome's reward is multiplied by this (a session outcome spread with a discount)"
    )
    session_outcome = models.ForeignKey(
        "ConversationOutcome",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="spread",
        help_text="set when this row is a session outcome spread to the turn; the turn's own feedback replaces it",
    )
    kept_text = models.TextField(
        blank=True,
        help_text="for 'edited': what the user kept; for 'edit_persisted' (optional): the code still in the file",
    )
    accepted_chars = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="for 'partial': how many leading characters of the completion the user took (1 to its length − 1)",
    )
    occurred_at = models.DateTimeField(help_text="when the user acted (client clock, else receipt)")
    received_at = models.DateTimeField(help_text="when the first event for this interaction arrived")
    updated_at = models.DateTimeField()
    events_received = models.PositiveIntegerField(default=1, help_text="events merged into this row")
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "interaction"],
                condition=Q(interaction__isnull=False),
                name="feedback_one_per_interaction",
            ),
            models.UniqueConstraint(
                fields=["tenant", "pending_client_id"],
                condition=Q(pending_client_id__isnull=False),
                name="feedback_one_per_pending_client_id",
            ),
            models.CheckConstraint(
                condition=Q(interaction__isnull=False) | Q(pending_client_id__isnull=False),
                name="feedback_names_an_interaction",
            ),
        ]
        # The overview's feedback arrivals per minute read the last half hour of this index.
        # A training window walks the tenant's events oldest first in steps of this one (tenant, id).
        indexes = [
            models.Index(fields=["tenant", "updated_at"], name="feedback_tenant_updated"),
            models.Index(fields=["tenant", "id"], name="feedback_tenant_id"),
        ]


# The outcomes that say the user saw the suggestion (accept rate of shown = accepted / these). A partial
# accept was seen; it is not a full accept, so it counts as shown and not as accepted in the accept
# rate (as an edited one), while the show gate treats it as accepted (apps.training.dataset.show_event).
SHOWN_OUTCOMES = (
    Feedback.Outcome.ACCEPTED,
    Feedback.Outcome.REJECTED,
    Feedback.Outcome.EDITED,
    Feedback.Outcome.PARTIAL,
)


class PersistenceReport(models.Model):
    """What was left of an accepted completion some time after the accept, at one checkpoint.

    A client reports the text now at the insertion point (or the document), or a share it measured;
    Strop computes ``retained_chars`` (apps.interactions.retention). One row per (interaction,
    checkpoint): a report sent twice is counted once and the latest measurement wins. A report may
    arrive before its interaction (naming the tenant's client id): it waits with
    ``pending_client_id`` set, its text kept until it can be measured, as pending feedback does."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    interaction = models.ForeignKey(
        Interaction, null=True, blank=True, on_delete=models.CASCADE, related_name="persistence_reports"
    )
    pending_client_id = models.CharField(max_length=200, null=True, blank=True)
    checkpoint_s = models.PositiveIntegerField(help_text="seconds after the accept when the text was read")
    accepted_chars = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="characters accepted (the completion, or the leading part a partial accept took); "
        "empty while pending without a partial accept",
    )
    retained_chars = models.PositiveIntegerField(
        null=True, blank=True, help_text="characters of the accepted text still there; empty while pending"
    )
    reported_ratio = models.FloatField(null=True, blank=True, help_text="the share the client measured, if it sent one")
    pending_text = models.TextField(blank=True, help_text="the reported text, kept only until it is measured")
    kept_text = models.TextField(
        blank=True, help_text="the stretch of the reported text where the accepted text was found (edits included)"
    )
    occurred_at = models.DateTimeField(help_text="when the client read the text (client clock, else receipt)")
    received_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    events_received = models.PositiveIntegerField(default=1)
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "interaction", "checkpoint_s"],
                condition=Q(interaction__isnull=False),
                name="persistence_one_per_checkpoint",
            ),
            models.UniqueConstraint(
                fields=["tenant", "pending_client_id", "checkpoint_s"],
                condition=Q(pending_client_id__isnull=False),
                name="persistence_pending_one_per_checkpoint",
            ),
            models.CheckConstraint(
                condition=Q(interaction__isnull=False) | Q(pending_client_id__isnull=False),
                name="persistence_names_an_interaction",
            ),
        ]


class ConversationOutcome(models.Model):
    """How an agent session ended, spread over its turns as per-turn feedback.

    It names the turn it follows (``turn``): that turn gets the outcome at full weight, and each
    earlier turn ``t`` gets it at weight ``discount ** (turn - t)`` (``discount`` 0: that turn
    only). Turns after it are not touched. A turn's own feedback always wins over a spread one.
    Turns that arrive later get it when they arrive. One per session; last write wins by the time
    the user acted."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    conversation_id = models.CharField(max_length=200)
    turn = models.PositiveIntegerField()
    outcome = models.CharField(max_length=32, choices=Feedback.Outcome.choices)
    discount = models.FloatField(default=0.0)
    occurred_at = models.DateTimeField()
    received_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    events_received = models.PositiveIntegerField(default=1)
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "conversation_id"], name="conversation_outcome_one_per_session")
        ]

    def weight_for(self, turn: int) -> float:
        """The weight of this outcome on ``turn`` (0 for turns after the one it names)."""
        if turn > self.turn:
            return 0.0
        return 1.0 if turn == self.turn else self.discount ** (self.turn - turn)


class ServingFailure(models.Model):
    """A completion Strop could not serve because vLLM failed (down, too slow, broke mid-stream).

    Kept apart from interactions: a failed request served nothing to learn from, and an
    interaction is only ever a whole served completion. Serving writes these; experiments read
    them as the error-rate guardrail of the arm that was asked. The table keeps the name it was
    created with in the serving app."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.ForeignKey("adapters.Adapter", on_delete=models.CASCADE, related_name="+")
    adapter_version = models.ForeignKey(
        "adapters.AdapterVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    experiment = models.ForeignKey(
        "experiments.Experiment", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    experiment_arm = models.CharField(max_length=64, blank=True)
    end_user_id = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=32, help_text="the error code: vllm_unavailable, vllm_error, ...")
    message = models.TextField(blank=True)
    streamed = models.BooleanField(default=False, help_text="the failure came after the stream had started")
    stream_ids = models.JSONField(  # nullable: a process from before the column inserts without it
        default=list,
        null=True,
        blank=True,
        help_text="the interaction ids a failed stream had given out: feedback sent on them waits as pending "
        "under these, and an erase of the user finds it here",
    )
    occurred_at = models.DateTimeField()
    latency_ms = models.FloatField(null=True, blank=True)

    class Meta:
        db_table = "serving_servingfailure"
        indexes = [
            models.Index(fields=["tenant", "occurred_at"], name="serving_ser_tenant__803cf5_idx"),
            models.Index(fields=["experiment", "end_user_id"], name="serving_ser_experim_7843ec_idx"),
        ]


# Latency histogram of a rollup: the upper bounds (ms) of its buckets; the last bucket has none.
LATENCY_BOUNDS_MS = (50, 100, 200, 500, 1000, 2000, 5000)


class InteractionRollup(models.Model):
    """Interactions of one hour (or day) of one tenant, counted per adapter, version, experiment arm
    and feedback outcome: what the dashboard's pages read instead of raw rows.

    A row is per outcome (``""``: no feedback yet), so every figure is a sum over rows: shown,
    accepted, partial and edited are the ``suggestions`` of those outcomes, and the reward is the
    outcome's reward times ``reward_weight`` (read with the adapter's reward table of the moment,
    never stored: a policy change re-prices history as the raw rows would). ``model_name`` is kept
    only where ``adapter`` is empty, as the attribution rule needs (``interaction_belongs_to_adapter``
    filters these rows as it filters interactions). Maintained by ``apps.interactions.rollups``.

    ``pruned`` rows are no rollup a page reads: they keep, per hour, what retention deleted of that
    hour's raw rows, so that an hour is always recomputed exactly, as what is left plus them."""

    class Period(models.TextChoices):
        HOUR = "hour"
        DAY = "day"
        PRUNED = "pruned"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    period = models.CharField(max_length=8, choices=Period.choices)
    bucket_start = models.DateTimeField(help_text="the hour (or day, UTC) the interactions were served in")
    adapter = models.ForeignKey(
        "adapters.Adapter", null=True, blank=True, on_delete=models.CASCADE, related_name="+", db_constraint=False
    )
    model_name = models.CharField(max_length=200, blank=True)
    adapter_version = models.ForeignKey(
        "adapters.AdapterVersion",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        db_constraint=False,
    )
    experiment_id = models.BigIntegerField(null=True, blank=True)
    experiment_arm = models.CharField(max_length=64, blank=True)
    outcome = models.CharField(max_length=32, blank=True, help_text="the feedback's outcome; empty: none yet")
    requests = models.PositiveIntegerField(default=0)
    suggestions = models.PositiveIntegerField(default=0, help_text="requests whose completion is not empty")
    reward_weight = models.FloatField(default=0.0, help_text="the sum of the feedback rows' reward weights")
    latency_count = models.PositiveIntegerField(default=0)
    latency_sum_ms = models.FloatField(default=0.0)
    latency_buckets = models.JSONField(default=list, help_text="counts per LATENCY_BOUNDS_MS bucket, then above")

    class Meta:
        indexes = [models.Index(fields=["tenant", "period", "bucket_start"])]


class RollupDirty(models.Model):
    """An hour of a tenant whose rollups must be recomputed: written by database triggers on every
    change to interactions and feedback (whatever code path makes it), consumed by
    ``apps.interactions.rollups.rollups_refresh``. No foreign key: a tenant's deletion cascades
    through interactions, whose triggers write marks as the tenant goes."""

    tenant_id = models.BigIntegerField()
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["tenant_id", "id"])]


class StreamPart(models.Model):
    """What an open stream served of one choice since its last write (``apps.serving.stream_record``),
    so that a worker killed outright (SIGKILL, the OOM killer) loses only what it served after it.

    Append-only while the stream runs: each write adds the text, tokens and logprobs served since the
    one before (``seq`` counts them; the first, ``seq`` 0, also holds ``head``: the interaction row
    as it will be recorded, without what was served). Never an interaction: training, metrics and
    the dashboard read only ``Interaction``. The stream's end records the whole interaction and
    deletes its parts; a stream whose parts nobody touched for ``STROP_SERVING_STALE_STREAM_S`` (its
    worker died) is recorded from them as a partial interaction by the sweeper
    (``apps.interactions.stream_parts``). Feedback on an open stream's id waits as pending."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    interaction_id = models.UUIDField()
    seq = models.PositiveIntegerField()
    written_at = models.DateTimeField()
    head = models.JSONField(null=True, blank=True)
    completion = models.TextField(blank=True)
    completion_token_ids = models.JSONField(default=list)
    completion_logprobs = models.JSONField(default=list)
    metadata = models.JSONField(default=dict, blank=True, help_text="merged over the head's, later parts last")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "interaction_id", "seq"], name="stream_part_one_per_seq"),
        ]
        indexes = [models.Index(fields=["written_at"], name="stream_part_written")]
