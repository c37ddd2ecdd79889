from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_slug
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from apps.common.exceptions import Conflict, ValidationFailed
from apps.tenants.keys import generate_key, hash_key
from apps.tenants.models import RETENTION_DAYS_MOST, ApiKey, AuditEvent, Membership, Tenant

ALL_SCOPES = [choice.value for choice in ApiKey.Scope]
# What a key made without naming its scopes gets: everything, less `editor` (a subset of the rest).
DEFAULT_SCOPES = [scope for scope in ALL_SCOPES if scope != ApiKey.Scope.EDITOR]


@dataclass(frozen=True)
class IssuedKey:
    """The stored key and its raw value, which exists only here and is shown once."""

    api_key: ApiKey
    raw_key: str


def audit_record(
    tenant: Tenant, *, actor: str, action: str, target_type: str, target_id: str, data: dict[str, Any] | None = None
) -> AuditEvent:
    return AuditEvent.objects.create(
        tenant=tenant, actor=actor, action=action, target_type=target_type, target_id=target_id, data=data or {}
    )


# The largest value a PositiveIntegerField holds on every database Strop runs on.
_LARGEST_POSITIVE_INT = 2_147_483_647


def _tenant_fields_check(*, name: str, slug: str, rate_limit_per_minute: int) -> None:
    """What a tenant's columns and the dashboard's URLs (``<slug:tenant_slug>``) can hold."""
    name_most = Tenant._meta.get_field("name").max_length or 0
    if len(name) > name_most:
        raise ValidationFailed(f"name: at most {name_most} characters")
    slug_most = Tenant._meta.get_field("slug").max_length or 0
    if len(slug) > slug_most:
        raise ValidationFailed(f"slug: at most {slug_most} characters")
    try:
        validate_slug(slug)  # the rule of the `slug` path converter every tenant page's URL uses
    except DjangoValidationError:
        raise ValidationFailed(f"slug: {slug!r} may hold only ASCII letters, digits, hyphens and underscores") from None
    if not slug[0].isalnum():
        # A version's vLLM name starts with the tenant's slug, and vLLM replicas that fetch from
        # object storage take only names that start with a letter or digit (strop_vllm_store.NAME).
        raise ValidationFailed(f"slug: {slug!r} must start with a letter or digit, not {slug[0]!r}")
    if isinstance(rate_limit_per_minute, bool) or not isinstance(rate_limit_per_minute, int):
        raise ValidationFailed("rate_limit_per_minute: a whole number of requests (0: the platform default)")
    if rate_limit_per_minute < 0:
        raise ValidationFailed("rate_limit_per_minute: at least 0 (0: the platform default)")
    if rate_limit_per_minute > _LARGEST_POSITIVE_INT:
        raise ValidationFailed(f"rate_limit_per_minute: at most {_LARGEST_POSITIVE_INT}")


def tenant_create(
    *, name: str, slug: str | None = None, rate_limit_per_minute: int = 0, accept_pending_feedback: bool = True
) -> Tenant:
    """A tenant, audited. Without a slug, one is made from the name (cut to the column's length)."""
    slug_most = Tenant._meta.get_field("slug").max_length or 0
    slug = slug or slugify(name)[:slug_most].strip("-_")
    if not slug:
        raise ValidationFailed("name: a tenant needs a name with at least one letter or digit")
    _tenant_fields_check(name=name, slug=slug, rate_limit_per_minute=rate_limit_per_minute)
    try:
        with transaction.atomic():
            tenant = Tenant.objects.create(
                name=name,
                slug=slug,
                rate_limit_per_minute=rate_limit_per_minute,
                accept_pending_feedback=accept_pending_feedback,
            )
            audit_record(tenant, actor="system", action="tenant.create", target_type="tenant", target_id=slug)
    except IntegrityError:
        raise Conflict(f"a tenant with slug {slug!r} already exists", code="tenant_exists") from None
    return tenant


@transaction.atomic
def tenant_create_with_key(
    *, name: str, slug: str | None = None, rate_limit_per_minute: int = 0, scopes: list[str], key_name: str
) -> tuple[Tenant, IssuedKey]:
    """A tenant and its first key, both or neither: the scopes are checked before anything is written."""
    _validated_scopes(scopes)
    tenant = tenant_create(name=name, slug=slug, rate_limit_per_minute=rate_limit_per_minute)
    return tenant, api_key_create(tenant, name=key_name, scopes=scopes)


def _validated_scopes(scopes: list[str]) -> list[str]:
    unknown = sorted(set(scopes) - set(ALL_SCOPES))
    if unknown:
        raise ValidationFailed(
            f"scopes: unknown scope(s) {', '.join(unknown)}; choose from {', '.join(ALL_SCOPES)}",
            details={"scopes": unknown},
        )
    if not scopes:
        raise ValidationFailed(f"scopes: give at least one of {', '.join(ALL_SCOPES)}")
    return [scope for scope in ALL_SCOPES if scope in scopes]


TENANT_SETTINGS = (
    "default_opt_in",
    "experiment_auto_promote",
    "experiment_auto_rollback",
    "accept_pending_feedback",
    "retention_days",
)


def _retention_days_check(value: Any) -> None:
    """Whole days, at least 1, at most the operator's maximum; null: the maximum (or forever)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationFailed("retention_days: a whole number of days, at least 1 (or null)")
    most = int(settings.STROP_RETENTION_MAX_DAYS)
    if most and value > most:
        raise ValidationFailed(f"retention_days: at most {most} (the operator's maximum, STROP_RETENTION_MAX_DAYS)")
    if value > RETENTION_DAYS_MOST:
        raise ValidationFailed(f"retention_days: at most {RETENTION_DAYS_MOST} (100 years; null keeps them forever)")


@transaction.atomic
def tenant_settings_update(tenant: Tenant, *, actor: str, changes: dict[str, Any]) -> Tenant:
    """Change the tenant's own settings (true/false; retention in days), audited with before and after.
    Naming none changes nothing: no write, no audit row; the tenant comes back as stored."""
    for name, value in changes.items():
        if name not in TENANT_SETTINGS:
            raise ValidationFailed(f"{name}: not a tenant setting ({', '.join(TENANT_SETTINGS)})", code="unknown_field")
        if name == "retention_days":
            _retention_days_check(value)
        elif not isinstance(value, bool):
            raise ValidationFailed(f"{name}: must be true or false")
    if not changes:
        tenant.refresh_from_db()
        return tenant
    before = {name: getattr(tenant, name) for name in changes}
    for name, value in changes.items():
        setattr(tenant, name, value)
    tenant.save(update_fields=list(changes))
    audit_record(
        tenant,
        actor=actor,
        action="tenant.settings",
        target_type="tenant",
        target_id=tenant.slug,
        data={"before": before, "after": changes},
    )
    return tenant


@transaction.atomic
def api_key_create(
    tenant: Tenant, *, name: str, scopes: list[str], actor: str = "system", default_opt_in: bool | None = None
) -> IssuedKey:
    ordered = _validated_scopes(scopes)
    generated = generate_key()
    api_key = ApiKey.objects.create(
        tenant=tenant,
        name=name,
        prefix=generated.prefix,
        key_hash=hash_key(generated.raw),
        scopes=ordered,
        default_opt_in=default_opt_in,
    )
    audit_record(
        tenant,
        actor=actor,
        action="api_key.create",
        target_type="api_key",
        target_id=str(api_key.pk),
        data={"name": name, "scopes": ordered, "prefix": api_key.prefix, "default_opt_in": default_opt_in},
    )
    return IssuedKey(api_key=api_key, raw_key=generated.raw)


@transaction.atomic
def api_key_revoke(tenant: Tenant, *, api_key: ApiKey, actor: str) -> ApiKey:
    if api_key.tenant_id != tenant.pk:
        raise ValueError("api_key belongs to another tenant")
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        audit_record(tenant, actor=actor, action="api_key.revoke", target_type="api_key", target_id=str(api_key.pk))
    return api_key


def api_key_touch(*, api_key: ApiKey, resolution_s: int) -> None:
    """Record use, at most once per ``resolution_s`` so authentication stays off the write path."""
    now = timezone.now()
    if api_key.last_used_at is None or (now - api_key.last_used_at).total_seconds() >= resolution_s:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now


@transaction.atomic
def membership_create(tenant: Tenant, *, user: Any, role: str, actor: str = "system") -> Membership:
    """Give a dashboard user a role in ``tenant`` (a user already in it gets the new role)."""
    if role not in Membership.Role.values:
        raise ValidationFailed(f"role: {role!r} is not a role; choose from {', '.join(Membership.Role.values)}")
    membership, created = Membership.objects.update_or_create(tenant=tenant, user=user, defaults={"role": role})
    audit_record(
        tenant,
        actor=actor,
        action="membership.create" if created else "membership.update",
        target_type="user",
        target_id=str(user.pk),
        data={"username": user.get_username(), "role": role},
    )
    return membership
