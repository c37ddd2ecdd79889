from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models

# The longest retention a tenant may set: 100 years (null keeps forever). Beyond some 2,000 years a
# cutoff falls before the first year a date can hold.
RETENTION_DAYS_MOST = 36_500


class Tenant(models.Model):
    """A customer of Strop. Every tenant-owned row points here."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    rate_limit_per_minute = models.PositiveIntegerField(
        default=0, help_text="API requests per minute for all of this tenant's keys; 0 = the platform default."
    )
    accept_pending_feedback = models.BooleanField(
        default=True,
        help_text="Keep feedback that names a client id not seen yet, and attach it when the interaction arrives.",
    )
    retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Delete interactions and their feedback older than this many days (empty: the operator's "
        "maximum, STROP_RETENTION_MAX_DAYS, or forever without one). Rollups, and so the charts, are kept.",
    )
    default_opt_in = models.BooleanField(
        default=False,
        help_text="consent of an end user Strop sees for the first time without an opted_in flag "
        "(a key may say otherwise: editor plugins send no flag)",
    )
    experiment_auto_promote = models.BooleanField(
        default=False, help_text="promote a candidate as soon as its experiment decides 'promote'"
    )
    experiment_auto_rollback = models.BooleanField(
        default=False, help_text="roll a candidate back as soon as its experiment decides 'rollback'"
    )
    max_concurrent_training_runs = models.PositiveIntegerField(
        default=1, help_text="training runs of this tenant at once, so one tenant cannot starve the rest"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A dashboard user's role in one tenant."""

    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        VIEWER = "viewer"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user_per_tenant")]


class ApiKey(models.Model):
    """A tenant's API key. Only a keyed hash of the secret is stored; the key is shown once."""

    class Scope(models.TextChoices):
        INGEST = "ingest"
        FEEDBACK = "feedback"
        SERVE = "serve"
        ADMIN = "admin"
        # Editor plugins: completions, and feedback on what this key served; no reads, no consent
        # given (apps.tenants.permissions.acts_as_editor; docs/editors.md).
        EDITOR = "editor"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    default_opt_in = models.BooleanField(
        null=True,
        blank=True,
        help_text="consent of new end users seen through this key without a flag; empty = the tenant's default",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class AuditEvent(models.Model):
    """Every state-changing admin action, written in the same transaction as the change."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="audit_events")
    actor = models.CharField(max_length=200, help_text="key:<prefix>, user:<id> or system")
    action = models.CharField(max_length=100)
    target_type = models.CharField(max_length=100)
    # As long as the longest name a target has: an adapter version's vLLM name takes up to 200.
    target_id = models.CharField(max_length=255)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at"])]


class Invitation(models.Model):
    """An invitation to join a tenant with a role. Only a keyed hash of its token is stored; the
    link that carries the token is shown once, to the member who invites. Used at most once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=16, choices=Membership.Role.choices, default=Membership.Role.VIEWER)
    note = models.CharField(max_length=200, blank=True, help_text="an email or a name, for the team to recognise it")
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "expires_at"])]

    def state(self, now: datetime) -> str:
        """``pending`` while it can be accepted; else why not: ``used``, ``revoked`` or ``expired``."""
        if self.used_at is not None:
            return "used"
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= now:
            return "expired"
        return "pending"
