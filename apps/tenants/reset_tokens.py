"""Password-reset tokens bound to what they were issued under.

Django's default token changes only when the password, the last sign-in or the e-mail changes. A
link that opens an account must also stop working when what the account may do changes: both
kinds of link here hash the account's memberships and roles, so promoting the member, giving them
another tenant or taking one away kills every link issued before.

- ``self_service_tokens``: the link "Forgot your password?" mails to the account's own address;
  ``PASSWORD_RESET_TIMEOUT`` long.
- ``handed_over_tokens``: the link an owner or admin makes on the Team page and hands over. It
  also names and hashes its issuer and the issuer's memberships and roles (a demoted or removed
  issuer's links die), lives ``STROP_ADMIN_RESET_LINK_TTL_S`` seconds, and is made under a salt of
  its own, so it is never accepted as a self-service link with the longer life.

``reset_link_tokens`` is what the confirmation page checks: either kind. When a handed-over link is
used, ``team.handed_over_link_refusal`` asks the Team page's refusal rules again, for its issuer, now.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.tokens import PasswordResetTokenGenerator
from django.utils.crypto import constant_time_compare, salted_hmac
from django.utils.http import base36_to_int, int_to_base36

from apps.tenants.models import Membership

# The largest id any database's integer column holds (SQLite's and Postgres' bigint): a link naming a
# larger issuer names no one, and SQLite refuses to even compare with it (OverflowError).
_LARGEST_ID = 2**63 - 1


def account_standing(user_id: Any) -> str:
    """What the account may do, as text that changes whenever a membership or role changes."""
    rows = Membership.objects.filter(user_id=user_id).order_by("tenant_id").values_list("tenant_id", "role")
    return ";".join(f"{tenant_id}:{role}" for tenant_id, role in rows)


class MembershipBoundTokenGenerator(PasswordResetTokenGenerator):
    """Django's token, also invalidated by any change of the account's memberships or roles."""

    key_salt = "strop.tenants.reset_tokens.MembershipBoundTokenGenerator"

    def _make_hash_value(self, user: Any, timestamp: int) -> str:
        return f"{super()._make_hash_value(user, timestamp)}|{account_standing(user.pk)}"


class HandedOverTokenGenerator(MembershipBoundTokenGenerator):
    """``<issuer id, base 36>-<timestamp, base 36>-<hash>``: a link a team member made for another."""

    key_salt = "strop.tenants.reset_tokens.HandedOverTokenGenerator"

    def make_token_for(self, user: Any, *, issuer_id: int) -> str:
        return self._handed_token(user, issuer_id, self._num_seconds(self._now()), self.secret)

    def make_token(self, user: Any) -> str:
        raise TypeError("a handed-over link names its issuer: use make_token_for(user, issuer_id=...)")

    def issuer_id(self, token: str | None) -> int | None:
        """The issuer a token of this kind names (not yet checked); None for any other token."""
        parts = (token or "").split("-")
        if len(parts) != 3:
            return None
        try:
            issuer_id = base36_to_int(parts[0])
        except ValueError:
            return None
        return issuer_id if issuer_id <= _LARGEST_ID else None

    def check_token(self, user: Any, token: str | None) -> bool:
        issuer_id = self.issuer_id(token)
        if not user or issuer_id is None or token is None:
            return False
        try:
            timestamp = base36_to_int(token.split("-")[1])
        except ValueError:
            return False
        if not any(
            constant_time_compare(self._handed_token(user, issuer_id, timestamp, secret), token)
            for secret in [self.secret, *self.secret_fallbacks]
        ):
            return False
        age_s = self._num_seconds(self._now()) - timestamp
        return 0 <= age_s <= settings.STROP_ADMIN_RESET_LINK_TTL_S

    def _handed_token(self, user: Any, issuer_id: int, timestamp: int, secret: Any) -> str:
        value = f"{self._make_hash_value(user, timestamp)}|by:{issuer_id}|{account_standing(issuer_id)}"
        digest = salted_hmac(self.key_salt, value, secret=secret, algorithm=self.algorithm).hexdigest()[::2]
        return f"{int_to_base36(issuer_id)}-{int_to_base36(timestamp)}-{digest}"


class ResetLinkTokens:
    """What the confirmation page accepts: a self-service token or a handed-over one, each by its own rules."""

    def check_token(self, user: Any, token: str | None) -> bool:
        if handed_over_tokens.issuer_id(token) is not None:
            return handed_over_tokens.check_token(user, token)
        return self_service_tokens.check_token(user, token)


self_service_tokens = MembershipBoundTokenGenerator()
handed_over_tokens = HandedOverTokenGenerator()
reset_link_tokens = ResetLinkTokens()
