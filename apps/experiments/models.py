from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.adapters.models import Adapter, AdapterVersion
from apps.cohorts.models import EndUser
from apps.experiments.assignment import ARMS, CANDIDATE, CONTROL  # noqa: F401  (re-exported)
from apps.tenants.models import Tenant


class Experiment(models.Model):
    """A candidate version against production, on the adapter's opted-in end users."""

    class Status(models.TextChoices):
        DRAFT = "draft"
        RUNNING = "running"
        STOPPED = "stopped"
        DECIDED = "decided"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="experiments")
    control_version = models.ForeignKey(
        AdapterVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="production when the experiment started; empty = the base model alone",
    )
    candidate_version = models.ForeignKey(AdapterVersion, on_delete=models.PROTECT, related_name="+")
    candidate_weight = models.FloatField(default=0.5, help_text="share of the opted-in users the candidate serves")
    salt = models.CharField(max_length=32, help_text="fixed at start: assignments never move while it runs")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    config = models.JSONField(default=dict, help_text="the statistics' configuration (ExperimentConfig)")
    auto_promote = models.BooleanField(default=False, help_text="act on 'promote' without a person")
    auto_rollback = models.BooleanField(default=False, help_text="act on 'rollback' without a person")
    decision = models.CharField(max_length=32, blank=True, help_text="promote, rollback or inconclusive")
    decision_reason = models.TextField(blank=True)
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    ended_by = models.CharField(max_length=200, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["adapter"], condition=Q(status="running"), name="experiment_one_running_per_adapter"
            ),
            models.CheckConstraint(
                condition=Q(candidate_weight__gt=0) & Q(candidate_weight__lt=1), name="experiment_weight_in_0_1"
            ),
        ]
        indexes = [models.Index(fields=["tenant", "status"])]

    def version_of(self, arm: str) -> AdapterVersion | None:
        return self.candidate_version if arm == CANDIDATE else self.control_version


class ExperimentExposure(models.Model):
    """An opted-in end user met the experiment: once per user, with the arm they were assigned."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="exposures")
    end_user = models.ForeignKey(EndUser, on_delete=models.CASCADE, related_name="exposures")
    arm = models.CharField(max_length=16)
    first_exposed_at = models.DateTimeField()
    # Production behaviour before the first exposure, frozen when it is recorded
    # (apps.experiments.history): the covariates of the adjusted lift never move afterwards.
    # Plain integers, nullable, no default: adding them to a large exposures table is a catalogue
    # change (a CHECK constraint would scan every row under an exclusive lock).
    history_requests = models.IntegerField(null=True, blank=True)
    history_shown = models.IntegerField(null=True, blank=True)
    history_accepted = models.IntegerField(null=True, blank=True)
    history_reward = models.FloatField(null=True, blank=True)
    history_frozen_at = models.DateTimeField(null=True, blank=True, help_text="empty: not frozen yet")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["experiment", "end_user"], name="exposure_once_per_user"),
        ]
        indexes = [models.Index(fields=["experiment", "arm"])]


class ExperimentArmCount(models.Model):
    """How many users each arm has exposed, kept by database triggers on every insert, delete and
    arm change of an exposure (migration 0005), whichever code path makes it: the dashboard reads
    it instead of counting a million exposures on each view. No foreign key: an exposure deleted
    with its experiment may update it after it is gone (the trigger then updates nothing)."""

    experiment_id = models.BigIntegerField()
    arm = models.CharField(max_length=16)
    exposures = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["experiment_id", "arm"], name="arm_count_once")]


class ExperimentSnapshot(models.Model):
    """The statistics at one moment, kept so the dashboard can draw them over time."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="snapshots")
    computed_at = models.DateTimeField()
    users = models.PositiveIntegerField(default=0)
    action = models.CharField(max_length=32, help_text="the decision at that moment")
    analysis = models.JSONField(help_text="apps.experiments.stats analysis, as_dict()")
    seconds = models.FloatField(default=0.0, help_text="time to compute it")

    class Meta:
        indexes = [models.Index(fields=["experiment", "computed_at"])]


class HoldoutSnapshot(models.Model):
    """The adapter's lineage against its holdout (the base model) at one moment, for the page."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="holdout_snapshots")
    computed_at = models.DateTimeField()
    users = models.PositiveIntegerField(default=0)
    analysis = models.JSONField(help_text="apps.experiments.stats analysis, as_dict(): control = the holdout")

    class Meta:
        indexes = [models.Index(fields=["adapter", "computed_at"])]


class PromotionAlarm(models.Model):
    """A promoted version whose behaviour fell beyond the bound against the holdout or the
    version before it: raised once per version and metric."""

    class Reference(models.TextChoices):
        HOLDOUT = "holdout"
        PREVIOUS = "previous"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.ForeignKey(Adapter, on_delete=models.CASCADE, related_name="alarms")
    version = models.ForeignKey(AdapterVersion, on_delete=models.CASCADE, related_name="alarms")
    metric = models.CharField(max_length=64)
    reference = models.CharField(max_length=16, choices=Reference.choices)
    observed = models.FloatField(help_text="the version's value since its promotion")
    reference_value = models.FloatField()
    relative_change = models.FloatField()
    reason = models.TextField()
    rolled_back = models.BooleanField(default=False, help_text="auto-rollback moved production back on it")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["version", "metric"], name="alarm_once_per_version_metric")]
        indexes = [models.Index(fields=["tenant", "created_at"])]


class PromotionWatch(models.Model):
    """The latest alarm check of a version promoted within the watch window, one row per adapter:
    per watched metric whether an alarm fires and, when none can, why (so a page says "too few
    effective users" rather than nothing)."""

    class Status(models.TextChoices):
        ALARM = "alarm"
        NO_ALARM = "no_alarm"
        TOO_FEW_USERS = "too_few_users"
        TOO_FEW_EFFECTIVE_USERS = "too_few_effective_users"
        NOT_TESTABLE = "not_testable"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    adapter = models.OneToOneField(Adapter, on_delete=models.CASCADE, related_name="promotion_watch")
    version = models.ForeignKey(AdapterVersion, on_delete=models.CASCADE, related_name="+")
    promoted_at = models.DateTimeField()
    reference = models.CharField(max_length=16, choices=PromotionAlarm.Reference.choices)
    checked_at = models.DateTimeField()
    metrics = models.JSONField(
        default=list,
        help_text="per watched metric: metric, label, status, users and effective_users (reference, version), "
        "observed, reference_value, relative_change, reason",
    )
