from __future__ import annotations

from django.db import models

from apps.tenants.models import Tenant


class EndUser(models.Model):
    """One of a tenant's end users, known by the tenant's own id, and their consent to learning."""

    # No index of its own: the unique (tenant, external_id) one leads with it. A prepared lookup by
    # external id planned on a near-empty table took that extra index once, and filtered every one
    # of the tenant's users (there the costs tie; the (tenant, opted_in) index can still tie them).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="end_users", db_index=False)
    external_id = models.CharField(max_length=200, help_text="the tenant's id for this user")
    opted_in = models.BooleanField(default=False, help_text="consents, now, to their events training models")
    opted_in_changed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "external_id"], name="end_user_unique_external_id"),
        ]
        indexes = [models.Index(fields=["tenant", "opted_in"])]


class ConsentChange(models.Model):
    """Append-only history of an end user's consent: who or what changed it, when, and how."""

    class Source(models.TextChoices):
        API = "api"
        IMPORT = "import"
        REQUEST = "request", "a request's opted_in flag"
        EDITOR = "editor", "an editor plugin's outcome"
        DASHBOARD = "dashboard"
        DEFAULT = "default", "the key's or tenant's default for new users"
        MIGRATION = "migration"

    # No index of its own: the (tenant, changed_at) index below leads with it (migration 0006).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # Nor this one: the (end_user, changed_at) index leads with it (migration 0007).
    end_user = models.ForeignKey(EndUser, on_delete=models.CASCADE, related_name="consent_history", db_index=False)
    opted_in = models.BooleanField()
    source = models.CharField(max_length=16, choices=Source.choices)
    actor = models.CharField(max_length=200, help_text="key:<prefix>, user:<id> or system")
    changed_at = models.DateTimeField()

    class Meta:
        # (tenant, changed_at): the cohorts chart's last 30 days of changes (migration 0005 builds it
        # without blocking writes).
        indexes = [models.Index(fields=["end_user", "changed_at"]), models.Index(fields=["tenant", "changed_at"])]


class ErasedId(models.Model):
    """A client id or conversation id that named an erased end user's data, as a keyed digest
    (apps.cohorts.erased): a label that would wait for it as pending (feedback, a persistence report,
    a session outcome sent late) is refused instead of keeping the user's text after the erase.
    Kept ``ERASED_IDS_KEPT`` (apps.cohorts.erased), then dropped by the hourly retention pass."""

    # An erase writes one row per id it removed, tens of thousands for a heavy user: no foreign key
    # check at commit (a tenant's delete still cascades here, in Django) and no index but the unique
    # one (the hourly expiry reads the table whole).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False)
    digest = models.CharField(
        max_length=32, help_text="HMAC-SHA256 of tenant, kind and id (ERASURE_MARK_KEY), its first 128 bits in hex"
    )
    erased_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "digest"], name="erased_id_one_per_digest")]
