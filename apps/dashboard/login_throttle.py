"""Throttles on the dashboard's doors: sign-in failures (django-axes) and "Forgot your password?".

Sign-in failures are counted per (username, address) pair, and per address with a higher limit
(``PairThenAddressHandler``, settings ``AXES_FAILURE_LIMIT`` and ``STROP_LOGIN_ADDRESS_FAILURE_LIMIT``):
nobody locks another person out from an address of their own, and one address guessing many names
is stopped. Reset requests are counted per client address and per e-mail address in the cache
(Redis), and a request over either limit sends no mail but gets the same answer as any other, so
the page never tells whether an account exists."""

from __future__ import annotations

import hashlib
import ipaddress
import logging

import redis
from axes.attempts import get_cool_off_threshold
from axes.handlers.database import AxesDatabaseHandler
from axes.models import AccessAttempt
from django.conf import settings
from django.core.cache import cache
from django.db.models import Sum
from django.http import HttpRequest

logger = logging.getLogger(__name__)


def client_address(request: HttpRequest) -> str | None:
    """The connection's address, or behind ``STROP_TRUSTED_PROXY_HOPS`` proxies the address the
    outermost of them saw. Each proxy appends the address it was called from to X-Forwarded-For, so
    that one is the hops-th from the right; anything further left came from the client and could be
    made up. A request with fewer entries than hops did not come through the proxies: its own address,
    as is one whose entry is no IP address (axes fails on one; a port after it is dropped)."""
    hops = settings.STROP_TRUSTED_PROXY_HOPS
    if hops > 0:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [part for part in forwarded if part]
        if len(forwarded) >= hops:
            address = _ip_address(forwarded[-hops])
            if address is not None:
                return address
    return request.META.get("REMOTE_ADDR")


def _ip_address(entry: str) -> str | None:
    """The address an X-Forwarded-For entry names, in its canonical form, without the port some
    proxies append (``1.2.3.4:5678``, ``[2001:db8::1]:443``) or an IPv6 zone (``%eth0``, which the
    database's address column refuses); None when it names none."""
    if entry.startswith("["):
        host, bracket, _ = entry[1:].partition("]")
        if not bracket:
            return None
    elif entry.count(":") == 1:  # IPv4 with a port; a bare IPv6 address has two or more
        host = entry.partition(":")[0]
    else:
        host = entry
    try:
        return str(ipaddress.ip_address(host.partition("%")[0]))
    except ValueError:
        return None


class PairThenAddressHandler(AxesDatabaseHandler):
    """django-axes' database handler with two limits instead of one (settings: AXES_HANDLER).

    Axes records each failure under (username, address, user agent) and, with
    ``AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]``, counts them per pair; a success
    clears only that pair's failures. Here an address's failures for every username also count,
    against ``STROP_LOGIN_ADDRESS_FAILURE_LIMIT``: past it, the address is locked for any name.
    Axes compares what ``get_failures`` answers with ``AXES_FAILURE_LIMIT``, so a locked address
    answers at least that."""

    def get_failures(self, request: HttpRequest, credentials: dict | None = None) -> int:
        pair = super().get_failures(request, credentials)
        address = getattr(request, "axes_ip_address", None)
        if not address:
            return pair
        from_address = (
            AccessAttempt.objects.filter(
                ip_address=address, attempt_time__gte=get_cool_off_threshold(request)
            ).aggregate(total=Sum("failures_since_start"))["total"]
            or 0
        )
        if from_address >= settings.STROP_LOGIN_ADDRESS_FAILURE_LIMIT:
            return max(pair, settings.AXES_FAILURE_LIMIT)
        return pair


def _counted(kind: str, value: str) -> int:
    """This window's requests for ``value`` (hashed: no address is stored as itself), this one included."""
    key = f"strop:password-reset:{kind}:{hashlib.sha256(value.encode()).hexdigest()}"
    window_s = settings.STROP_PASSWORD_RESET_WINDOW_S
    cache.add(key, 0, timeout=window_s)
    try:
        return cache.incr(key)
    except ValueError:  # the key expired between add and incr
        cache.add(key, 1, timeout=window_s)
        return 1


def password_reset_request_allowed(request: HttpRequest, email: str) -> bool:
    """Count a "Forgot your password?" request; False when its client or its e-mail address has asked
    too often in this window (``STROP_PASSWORD_RESET_REQUESTS_PER_CLIENT`` /
    ``STROP_PASSWORD_RESET_MAILS_PER_ACCOUNT`` per ``STROP_PASSWORD_RESET_WINDOW_S``)."""
    try:
        per_client = _counted("client", client_address(request) or "")
        per_account = _counted("account", email.strip().lower())
    except redis.RedisError:
        # Uncounted is unthrottled: send nothing until the cache answers again (the page says the same).
        logger.warning("password-reset throttle: the cache did not answer; no reset mail sent", exc_info=True)
        return False
    return (
        per_client <= settings.STROP_PASSWORD_RESET_REQUESTS_PER_CLIENT
        and per_account <= settings.STROP_PASSWORD_RESET_MAILS_PER_ACCOUNT
    )
