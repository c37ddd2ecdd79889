from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.adapters.models import Adapter, AdapterVersion
from apps.interactions.models import Feedback
from apps.interactions.rewards import reward_value
from apps.tenants.models import Tenant


class TrainingPolicy(models.Model):
    """When and how a tenant adapter trains; the tenant admin may change it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.OneToOneField(Adapter, on_delete=models.CASCADE, related_name="training_policy")
    enabled = models.BooleanField(default=True)
    min_new_events = models.PositiveIntegerField(default=256, help_text="new labelled events that start a run")
    max_wait_s = models.PositiveIntegerField(
        default=3600, help_text="start a run with fewer events once the oldest has waited this long"
    )
    heldout_fraction = models.FloatField(
        default=0.1, help_text="share of each window kept out of training for the gate"
    )
    # The reward policy: what each outcome is worth to the learner.
    reward_accepted = models.FloatField(default=0.75)
    reward_rejected = models.FloatField(default=-0.25)
    reward_not_shown = models.FloatField(default=0.0)
    reward_edited = models.FloatField(default=0.25)
    reward_partial = models.FloatField(
        default=0.25, help_text="a suggestion taken in part; its tokens get accepted / rejected credit (learning.md)"
    )
    # Agents' signals (see docs/agents.md, "Agents: chat completions, conversations and session outcomes").
    reward_thumbs_up = models.FloatField(default=1.0)
    reward_thumbs_down = models.FloatField(default=-1.0)
    reward_edit_persisted = models.FloatField(default=0.75)
    reward_edit_reverted = models.FloatField(default=-0.5)
    reward_follow_up_dissatisfied = models.FloatField(default=-0.5)
    reward_tool_call_failed = models.FloatField(default=-0.5)
    auto_experiment = models.BooleanField(
        default=False, help_text="start an A/B experiment with each candidate that passes the gate"
    )
    credit_retained = models.BooleanField(
        default=False,
        help_text="credit an accepted completion token by token from its persistence reports: the tokens still "
        "there at the latest checkpoint earn reward_accepted, the rest 0 (learning.md)",
    )
    show_gate = models.BooleanField(
        default=True, help_text="learn a show threshold per version: completions the model is unsure of are withheld"
    )
    show_gate_recall = models.FloatField(
        default=0.95, help_text="share of the window's accepted suggestions the threshold keeps (the show gate)"
    )
    show_gate_explore = models.FloatField(
        default=0.05, help_text="chance that serving shows a withheld suggestion anyway, so the gate keeps learning"
    )
    trainer_overrides = models.JSONField(default=dict, blank=True, help_text="PPOConfig fields to override")
    gate_overrides = models.JSONField(default=dict, blank=True, help_text="GateConfig fields to override")
    updated_at = models.DateTimeField(auto_now=True)

    def reward_table(self) -> dict[str, float]:
        """Each outcome's reward under this policy (``apps.interactions.rewards`` applies it)."""
        return {outcome: float(getattr(self, field)) for outcome, field in REWARD_FIELDS.items()}

    def reward_of(self, feedback: Feedback) -> float:
        """The feedback row's reward: its outcome's, times its weight (a spread session outcome)."""
        return reward_value(self.reward_table(), outcome=feedback.outcome, weight=feedback.reward_weight)


# The policy field that holds each outcome's reward.
REWARD_FIELDS: dict[str, str] = {outcome: f"reward_{outcome}" for outcome in Feedback.Outcome.values}


ACTIVE_STATUSES = ("queued", "exporting", "training", "evaluating")


class TrainingRun(models.Model):
    """One PPO update of one adapter: queued → exporting → training → evaluating → candidate | rejected | failed."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        EXPORTING = "exporting"
        TRAINING = "training"
        EVALUATING = "evaluating"
        CANDIDATE = "candidate"
        REJECTED = "rejected"
        FAILED = "failed"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="training_runs")
    parent_version = models.ForeignKey(
        AdapterVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="trained from this version; empty = a fresh LoRA on the base model",
    )
    output_version = models.ForeignKey(
        AdapterVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="produced_by",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    attempt = models.PositiveIntegerField(default=1, help_text="bumped each time the reaper requeues the run")
    trigger = models.CharField(max_length=64, blank=True, help_text="why it was scheduled")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    window_size = models.PositiveIntegerField(default=0, help_text="events trained on")
    heldout_size = models.PositiveIntegerField(default=0, help_text="events kept for the gate")
    trainer_summary = models.JSONField(default=dict, blank=True)
    gate = models.JSONField(default=dict, blank=True, help_text="the gate's verdict and numbers")
    stage_seconds = models.JSONField(default=dict, blank=True)
    log = models.TextField(blank=True)
    error = models.TextField(blank=True)
    dispatched_at = models.DateTimeField(
        null=True, blank=True, help_text="sent to the gpu queue (at most one waiting run per tenant)"
    )
    window_excluded_at = models.DateTimeField(
        null=True, blank=True, help_text="when a person left this rejected run's events out of training for good"
    )
    window_excluded_by = models.CharField(max_length=200, blank=True, help_text="who left them out")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["adapter"], condition=Q(status__in=ACTIVE_STATUSES), name="training_one_active_run_per_adapter"
            )
        ]
        indexes = [models.Index(fields=["status", "heartbeat_at"])]

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES


class TrainingRunEvent(models.Model):
    """One labelled event in a run's window: trained on, or held out for the gate."""

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="events")
    feedback = models.ForeignKey(Feedback, on_delete=models.CASCADE, related_name="+")
    held_out = models.BooleanField(default=False)
    reward = models.FloatField()
    # The label as the run read it: another one since (the user changed their mind, a corrected outcome
    # sent again) makes the event learned again (``_not_learned``); the same label sent again does not,
    # whenever it arrives. Empty on rows from before the column: taken as learned.
    outcome = models.CharField(max_length=32, blank=True, help_text="the event's outcome as the run read it")
    # No sample could be built from the event (its data, not the run's trouble): never taken again.
    left_out = models.BooleanField(default=False, help_text="no sample could be built from it; never taken again")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "feedback"], name="training_event_once_per_run")]
        indexes = [models.Index(fields=["feedback", "held_out"])]


class TrainingRunErasure(models.Model):
    """An end user erased while their events were in this run's window.

    Outlives the erased data on purpose: it holds a keyed one-way hash of the user, never the id,
    so the version the run produced (``run.output_version``) stays marked as having learned from
    an erased user, and its lineage can be retrained without them."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="erasures")
    user_hash = models.CharField(max_length=64)
    trained_on = models.BooleanField(help_text="in the trained part of the window (else only held out)")
    erased_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "user_hash"], name="training_erasure_once_per_run")]


class EvalSet(models.Model):
    """A tenant's fill-in-the-middle eval set for one adapter: the gate checks a candidate on it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.OneToOneField(Adapter, on_delete=models.CASCADE, related_name="eval_set")
    cases = models.JSONField(help_text='[{"prefix", "suffix", "middle"}, ...]')
    uploaded_at = models.DateTimeField(auto_now=True)
