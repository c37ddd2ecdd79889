"""Which addresses a tenant's webhook may reach: public unicast ones only.

A webhook URL is the tenant's to choose, and Strop's workers sit inside the operator's network, so
every address a name resolves to is classified here before anything connects, and the connection
then goes to exactly the vetted address (``apps.notifications.transport``): a name that answers
differently the second time (DNS rebinding) never gets a second resolution.

Besides what ``ipaddress`` calls private, loopback, link-local and reserved, addresses that carry
an IPv4 address inside IPv6 are refused when they can reach a private one: NAT64 (the gateway
translates ``64:ff9b::10.0.0.1`` to ``10.0.0.1``), 6to4 and Teredo (tunnels to an embedded v4
address), and IPv4-mapped or -compatible addresses are judged by the IPv4 address they hold.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# host, port -> the addresses the name resolves to (the system resolver by default; tests inject one).
Resolver = Callable[[str, int], Sequence[str]]

# Not covered (or not on every Python) by ipaddress's own flags.
_REFUSED_V4 = [
    (ipaddress.IPv4Network("100.64.0.0/10"), "shared address space (carrier-grade NAT)"),
    (ipaddress.IPv4Network("192.0.0.0/24"), "IETF protocol assignments"),
    (ipaddress.IPv4Network("198.18.0.0/15"), "benchmarking"),
]
_REFUSED_V6 = [
    (ipaddress.IPv6Network("64:ff9b::/96"), "NAT64"),
    (ipaddress.IPv6Network("64:ff9b:1::/48"), "NAT64 (local use)"),
    (ipaddress.IPv6Network("2002::/16"), "6to4"),
    (ipaddress.IPv6Network("2001::/32"), "Teredo"),
    (ipaddress.IPv6Network("2001::/23"), "IETF protocol assignments"),
    (ipaddress.IPv6Network("2001:db8::/32"), "documentation"),
    (ipaddress.IPv6Network("100::/64"), "discard-only"),
    (ipaddress.IPv6Network("fc00::/7"), "unique local (private)"),
    (ipaddress.IPv6Network("fec0::/10"), "site-local"),
    (ipaddress.IPv6Network("::/96"), "IPv4-compatible (deprecated)"),
]

NOT_PUBLIC = "the host resolves to an address that is not public"


def address_refusal(address: IPAddress) -> str | None:
    """Why Strop will not connect to ``address`` (a short label for logs and tests), or None for a
    public unicast address. The label may be logged; the tenant is never shown the address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            embedded = address_refusal(address.ipv4_mapped)
            return None if embedded is None else f"IPv4-mapped {embedded}"
        if address.scope_id:
            return "scoped (link-local)"
    if address.is_unspecified or address.is_loopback:
        return "unspecified" if address.is_unspecified else "loopback"
    refused = _REFUSED_V4 if isinstance(address, ipaddress.IPv4Address) else _REFUSED_V6
    for network, label in refused:  # the specific ranges before the flags: their labels say more
        if address in network:
            return label
    flags = (
        (address.is_link_local, "link-local"),
        (address.is_multicast, "multicast"),
        (address.is_private, "private"),
        (address.is_reserved, "reserved"),
    )
    for flagged, label in flags:
        if flagged:
            return label
    if not address.is_global:
        return "not globally routable"
    return None


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to now (TCP), in the resolver's order, without duplicates."""
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def resolve_public(host: str, port: int, *, resolver: Resolver, allow_private: bool) -> list[IPAddress]:
    """``host`` resolved once, every address vetted. Raises ``AddressRefused`` (with a message the
    tenant may read: it names the host, never an address) when the name does not resolve or any of
    its addresses is not public (unless ``allow_private``, for tests and a machine of one's own)."""
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            addresses = [ipaddress.ip_address(a) for a in resolver(host, port)]
        except (OSError, UnicodeError, ValueError):
            addresses = []
        if not addresses:
            raise AddressRefused(f"the host {host!r} does not resolve")
    if not allow_private and any(address_refusal(a) for a in addresses):
        raise AddressRefused(NOT_PUBLIC)
    return addresses


class AddressRefused(Exception):
    """The webhook's host may not be called; the message is safe to show the tenant."""
