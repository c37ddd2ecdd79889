"""Webhooks (registration, rotation, signing) and their deliveries; callers import from here."""

from apps.notifications.services.deliveries import (
    DeliveryAttempt,
    notification_send,
    retry_backoff_s,
    webhook_deliver,
    webhook_deliveries_resend,
    webhook_delivery_claim,
    webhook_delivery_record,
)
from apps.notifications.services.webhooks import (
    signature,
    signature_header,
    signing_secrets,
    webhook_address_problem,
    webhook_create,
    webhook_delete,
    webhook_secret_rotate,
    webhook_secrets_reseal,
    webhook_url_addresses,
    webhook_url_problem,
)

__all__ = [
    "DeliveryAttempt",
    "notification_send",
    "retry_backoff_s",
    "signature",
    "signature_header",
    "signing_secrets",
    "webhook_address_problem",
    "webhook_create",
    "webhook_delete",
    "webhook_deliver",
    "webhook_deliveries_resend",
    "webhook_delivery_claim",
    "webhook_delivery_record",
    "webhook_secret_rotate",
    "webhook_secrets_reseal",
    "webhook_url_addresses",
    "webhook_url_problem",
]
