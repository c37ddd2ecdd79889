from __future__ import annotations

from urllib.parse import urlsplit

from django.db import models

from apps.common.stored_secrets import SealedTextField
from apps.tenants.models import Tenant

EVENTS = {
    "experiment.decided": "an experiment ended with a decision: promote, rollback or inconclusive",
    "version.promoted": "a version became production",
    "version.rolled_back": "production moved back to an earlier version",
    "version.alarm": "a promoted version shows less than its holdout or the version before it (reward hacking?)",
    "run.failed": "a training run failed",
    "run.rejected": "a training run's candidate did not pass the eval gate",
}


def url_host(url: str) -> str:
    """What a viewer and the audit log see of a webhook's URL: its host (and port)."""
    return urlsplit(url).netloc.rpartition("@")[2] or url[:40]


SECRET_PURPOSE = "webhook.secret"  # what a sealed signing secret is bound to (apps.common.stored_secrets)


class Webhook(models.Model):
    """A tenant's endpoint for events, with the secret that signs every delivery to it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=500)
    events = models.JSONField(default=list, help_text="the event names it receives")
    # Stored encrypted under STORED_SECRETS_KEY (apps.common.stored_secrets); the attribute is the plaintext.
    secret = SealedTextField(purpose=SECRET_PURPOSE, help_text="signs deliveries (HMAC-SHA256); shown once")
    previous_secret = SealedTextField(
        purpose=SECRET_PURPOSE,
        blank=True,
        help_text="the secret before the last rotation: it also signs until its expiry",
    )
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"{self.tenant.slug}: {self.host}"

    @property
    def host(self) -> str:
        """The URL's host (and port, if any): what viewers see. The full URL often carries a token."""
        return url_host(self.url)


class WebhookDelivery(models.Model):
    """One event sent (or to be sent) to one webhook: every attempt's outcome is kept."""

    class Status(models.TextChoices):
        PENDING = "pending"
        SENDING = "sending"  # claimed by a worker, whose attempt is under way
        DELIVERED = "delivered"
        FAILED = "failed"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=64)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True, help_text="when the attempt under way began")
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "-created_at"]),
            models.Index(fields=["status", "next_attempt_at"]),
        ]
