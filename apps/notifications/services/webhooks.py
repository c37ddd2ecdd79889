"""A tenant's webhooks: registered (on a public address only), deleted, and their signing secret
rotated, each with its audit row.

A delivery is signed with the webhook's secret: ``X-Strop-Signature: sha256=<hex HMAC-SHA256 of
"<timestamp>.<body>">``, the timestamp in ``X-Strop-Timestamp``. After a rotation the header holds
two values for ``STROP_WEBHOOK_SECRET_OVERLAP_S``, ``sha256=<new>,sha256=<old>`` (as Stripe sends
several ``v1=``), so a receiver still on the old secret keeps accepting deliveries while it
switches; a receiver accepts a delivery when any value matches.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.common.exceptions import ValidationFailed
from apps.common.stored_secrets import Unreadable, current_key_id, opened, readable, sealed, sealed_by
from apps.notifications.addresses import AddressRefused, IPAddress, Resolver, resolve_public, system_resolver
from apps.notifications.models import EVENTS, SECRET_PURPOSE, Webhook, url_host
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record

MAX_WEBHOOKS_PER_TENANT = 20
# A rotation this soon after the last one repeats it (a form sent twice: a double click, a resubmit):
# no receiver can have switched to the secret made a moment ago, so that one is replaced and the
# secret the receiver still holds keeps signing until its overlap ends. Later, an admin may have put
# the new secret in the receiver already: a rotation then drops the oldest, as any rotation does.
ROTATION_REPEAT_WINDOW_S = 15


def webhook_url_problem(url: str) -> str | None:
    """Why ``url`` is not a URL Strop calls, by its form alone (no name resolved), or None."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a bracket unpaired or around no IPv6 address; a host NFKC would change
        if not url.isascii():
            return "must be ASCII without spaces (write an international host in its xn-- form)"
        return "is not a well-formed URL: square brackets go only around a whole IPv6 address"
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return "must be an http(s) URL with a host"
    if parts.username or parts.password:
        return "must not carry credentials; use the signature to authenticate Strop"
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        return "must be ASCII without spaces (write an international host in its xn-- form)"
    if not settings.STROP_WEBHOOK_ALLOW_PRIVATE and parts.scheme != "https":
        return "must use https"
    try:
        _ = parts.port
    except ValueError:
        return "has a port that is not a number from 0 to 65535"
    return None


def webhook_url_addresses(url: str, *, resolver: Resolver = system_resolver) -> list[IPAddress]:
    """The vetted addresses of a well-formed ``url``'s host, resolved once: every one public
    (``apps.notifications.addresses``) unless STROP_WEBHOOK_ALLOW_PRIVATE. Raises AddressRefused,
    whose message names no address."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return resolve_public(
        parts.hostname or "", port, resolver=resolver, allow_private=settings.STROP_WEBHOOK_ALLOW_PRIVATE
    )


def webhook_address_problem(url: str, *, resolver: Resolver = system_resolver) -> str | None:
    """Why Strop will not call ``url``, or None: its form, then every address its host resolves
    to (a tenant's webhook must never reach the operator's own network). Checked when registering
    and again before every attempt, which then connects to the address it vetted."""
    problem = webhook_url_problem(url)
    if problem or settings.STROP_WEBHOOK_ALLOW_PRIVATE:
        return problem  # allowed anything: a name need not resolve until a delivery is sent
    try:
        webhook_url_addresses(url, resolver=resolver)
    except AddressRefused as exc:
        return str(exc)
    return None


def _new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


@transaction.atomic
def webhook_create(
    tenant: Tenant, *, url: str, events: list[str], actor: str, resolver: Resolver = system_resolver
) -> Webhook:
    """Register an endpoint for ``events``; its signing secret is generated here (shown once)."""
    url = url.strip()
    problem = webhook_address_problem(url, resolver=resolver)
    if problem:
        raise ValidationFailed(f"url: {problem}")
    unknown = sorted(set(events) - set(EVENTS))
    if unknown or not events:
        raise ValidationFailed(f"events: choose one or more of {', '.join(EVENTS)}")
    # One registration at a time per tenant, so that neither the URL rule nor the limit is raced past
    # (a no-key lock: it does not hold back rows written for the tenant meanwhile).
    Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).first()
    if Webhook.objects.filter(tenant=tenant, url=url).exists():
        raise ValidationFailed(
            "url: this tenant already has a webhook for this URL (its secret was shown when it was added; "
            "rotate it from the list for a new one)"
        )
    if Webhook.objects.filter(tenant=tenant).count() >= MAX_WEBHOOKS_PER_TENANT:
        raise ValidationFailed(f"url: a tenant has at most {MAX_WEBHOOKS_PER_TENANT} webhooks; delete one first")
    webhook = Webhook.objects.create(
        tenant=tenant, url=url, events=[e for e in EVENTS if e in events], secret=_new_secret(), created_by=actor
    )
    audit_record(
        tenant,
        actor=actor,
        action="webhook.create",
        target_type="webhook",
        target_id=str(webhook.pk),
        data={"host": url_host(url), "events": webhook.events},
    )
    return webhook


@transaction.atomic
def webhook_delete(tenant: Tenant, *, webhook: Webhook, actor: str) -> None:
    if webhook.tenant_id != tenant.pk:
        raise ValueError("webhook belongs to another tenant")
    audit_record(
        tenant,
        actor=actor,
        action="webhook.delete",
        target_type="webhook",
        target_id=str(webhook.pk),
        data={"host": url_host(webhook.url)},
    )
    webhook.delete()


@transaction.atomic
def webhook_secret_rotate(tenant: Tenant, *, webhook: Webhook, actor: str) -> Webhook:
    """Give the webhook a new signing secret (on the returned webhook: show it once). The old one
    keeps signing beside it for STROP_WEBHOOK_SECRET_OVERLAP_S. Only the two newest ever sign, so a
    later rotation within that time drops the oldest at once; but one within ROTATION_REPEAT_WINDOW_S
    of the last repeats it: it replaces the secret that one made, which no receiver holds yet, and
    the previous secret (the receiver's) keeps signing until its own expiry."""
    if webhook.tenant_id != tenant.pk:
        raise ValueError("webhook belongs to another tenant")
    webhook = Webhook.objects.select_for_update().get(pk=webhook.pk)
    now = timezone.now()
    repeat = (
        webhook.secret_rotated_at is not None
        and now - webhook.secret_rotated_at < timedelta(seconds=ROTATION_REPEAT_WINDOW_S)
        and bool(webhook.previous_secret)
        and webhook.previous_secret_expires_at is not None
        and webhook.previous_secret_expires_at > now
    )
    changed = ["secret", "secret_rotated_at"]
    if repeat:
        expires: datetime | None = webhook.previous_secret_expires_at
    else:
        # A secret no configured key opens cannot sign beside the new one: the new one alone signs.
        opens = not isinstance(webhook.secret, Unreadable)
        expires = now + timedelta(seconds=settings.STROP_WEBHOOK_SECRET_OVERLAP_S) if opens else None
        webhook.previous_secret = webhook.secret if opens else ""
        webhook.previous_secret_expires_at = expires
        changed += ["previous_secret", "previous_secret_expires_at"]
    webhook.secret, webhook.secret_rotated_at = _new_secret(), now
    webhook.save(update_fields=changed)
    audit_record(
        tenant,
        actor=actor,
        action="webhook.secret_rotate",
        target_type="webhook",
        target_id=str(webhook.pk),
        data={
            "host": url_host(webhook.url),
            "previous_secret_valid_until": expires.isoformat() if expires else None,
            "repeat": repeat,
        },
    )
    return webhook


@dataclass
class ResealReport:
    key_id: str
    resealed: int = 0  # secrets sealed anew under the current key (or in the clear until now)
    current: int = 0  # already under it
    dropped: int = 0  # previous secrets past their overlap that no key opens: they sign nothing
    unreadable: set[int] = field(default_factory=set)  # webhooks with a secret no configured key opens


_SECRET_COLUMNS = ("secret", "previous_secret")


def webhook_secrets_reseal(*, now: datetime | None = None) -> ResealReport:
    """Seal every webhook's secrets under the current ``STORED_SECRETS_KEY`` (after a key rotation,
    or a secret stored in the clear; ``manage.py stored_secrets_reseal``). Each value is replaced
    only if it is still the one read (a rotation meanwhile wins). A secret no configured key opens is
    left as it is and its webhook named, unless it is a previous secret past its overlap: that one
    no longer signs, and goes."""
    now = now or timezone.now()
    report = ResealReport(key_id=current_key_id())
    table = connection.ops.quote_name(Webhook._meta.db_table)
    expiry = dict(Webhook.objects.values_list("pk", "previous_secret_expires_at"))
    with connection.cursor() as cursor:  # the stored text, not what the field opens it to
        cursor.execute(f"SELECT id, secret, previous_secret FROM {table}")
        rows = cursor.fetchall()
    for pk, secret, previous in rows:
        expires = expiry.get(pk)
        for column, stored in zip(_SECRET_COLUMNS, (secret, previous), strict=True):
            if not stored:
                continue
            if sealed_by(stored, report.key_id):
                report.current += 1
                continue
            plain = opened(stored, purpose=SECRET_PURPOSE)
            if isinstance(plain, Unreadable) and (column == "secret" or (expires is not None and expires > now)):
                report.unreadable.add(pk)
                continue
            if isinstance(plain, Unreadable):  # an expired previous secret: still expired, still this one
                expired = Q(previous_secret_expires_at__isnull=True) | Q(previous_secret_expires_at__lte=now)
                unchanged = Webhook.objects.filter(expired, pk=pk, previous_secret=stored)
                report.dropped += unchanged.update(previous_secret="")
                continue
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {table} SET {column} = %s WHERE id = %s AND {column} = %s",
                    [sealed(plain, purpose=SECRET_PURPOSE), pk, stored],
                )
                report.resealed += cursor.rowcount
    return report


def signing_secrets(webhook: Webhook, *, now: datetime) -> list[str]:
    """The secrets a delivery is signed with now: the current one, and the previous one during
    the overlap after a rotation. :class:`SecretUnreadable` when one of them cannot be opened (the
    key it was sealed under is gone: the delivery fails saying so)."""
    overlap = bool(webhook.previous_secret) and (
        webhook.previous_secret_expires_at is not None and webhook.previous_secret_expires_at > now
    )
    return [readable(webhook.secret), readable(webhook.previous_secret)] if overlap else [readable(webhook.secret)]


def signature(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def signature_header(webhook: Webhook, *, timestamp: str, body: bytes, now: datetime) -> str:
    """``X-Strop-Signature``: one ``sha256=`` value per signing secret, newest first, comma-separated."""
    return ",".join(signature(secret, timestamp, body) for secret in signing_secrets(webhook, now=now))
