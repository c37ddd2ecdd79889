"""The address guard: only public unicast addresses are called, every special range is refused
(NAT64, 6to4 and Teredo included), and what the tenant reads never shows a resolved address."""

from __future__ import annotations

import ipaddress

import pytest

from apps.common.exceptions import ValidationFailed
from apps.notifications.addresses import NOT_PUBLIC, AddressRefused, address_refusal, resolve_public
from apps.notifications.services import webhook_address_problem, webhook_create

REFUSED = {
    "0.0.0.0": "unspecified",
    "127.0.0.1": "loopback",
    "127.255.0.9": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "169.254.169.254": "link-local",
    "100.64.0.1": "shared address space (carrier-grade NAT)",
    "192.0.0.8": "private",
    "192.0.2.10": "private",
    "198.18.0.1": "private",
    "224.0.0.251": "multicast",
    "239.255.255.250": "multicast",
    "240.0.0.1": "private",
    "255.255.255.255": "private",
    "::": "unspecified",
    "::1": "loopback",
    "fe80::1": "link-local",
    "fc00::1": "private",
    "fd12:3456::1": "private",
    "fec0::1": "site-local",
    "ff02::1": "multicast",
    "2001:db8::1": "private",
    "64:ff9b::a00:1": "NAT64",  # NAT64 of 10.0.0.1
    "64:ff9b::808:808": "NAT64",  # even of a public address: the gateway is the operator's
    "64:ff9b:1::a00:1": "NAT64 (local use)",
    "2002:a00:1::1": "6to4",  # 6to4 of 10.0.0.1
    "2002:808:808::1": "6to4",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2": "Teredo",
    "::ffff:127.0.0.1": "IPv4-mapped loopback",
    "::ffff:10.0.0.1": "IPv4-mapped private",
    "::ffff:169.254.169.254": "IPv4-mapped link-local",
    "::10.0.0.1": "IPv4-compatible (deprecated)",
    "::8.8.8.8": "IPv4-compatible (deprecated)",
    "100::1": "discard-only",
}
PUBLIC = ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2a00:1450:4001:82a::200e", "::ffff:8.8.8.8"]


@pytest.mark.parametrize(("address", "label"), sorted(REFUSED.items()))
def test_every_special_range_is_refused(address, label):
    refusal = address_refusal(ipaddress.ip_address(address))
    assert refusal is not None, address
    # The label names the range (private ranges may be labelled by whichever flag matches first).
    assert refusal == label or label == "private", (address, refusal)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_unicast_addresses_pass(address):
    assert address_refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("address", ["64:ff9b::a00:1", "2002:a00:1::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2"])
def test_a_name_resolving_to_a_tunnel_address_is_refused_without_showing_it(address, settings):
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = False
    problem = webhook_address_problem("https://hooks.example.com/x", resolver=lambda host, port: [address])
    assert problem == NOT_PUBLIC
    assert address not in problem and str(ipaddress.ip_address(address)) not in problem


def test_one_address_that_is_not_public_refuses_the_name_whatever_the_others(settings):
    with pytest.raises(AddressRefused) as refused:
        resolve_public(
            "hooks.example.com", 443, resolver=lambda h, p: ["93.184.216.34", "10.0.0.7"], allow_private=False
        )
    assert "10.0.0.7" not in str(refused.value)


def test_a_name_that_does_not_resolve_is_refused_by_name():
    def nothing(host: str, port: int) -> list[str]:
        raise OSError("no such name")

    with pytest.raises(AddressRefused, match="^the host 'nowhere.invalid' does not resolve$"):
        resolve_public("nowhere.invalid", 443, resolver=nothing, allow_private=False)


@pytest.mark.django_db
def test_the_refusal_a_tenant_reads_names_no_address(make_tenant, settings):
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = False
    tenant = make_tenant("hooks-no-leak")
    with pytest.raises(ValidationFailed) as refused:
        webhook_create(tenant, url="https://localhost:8443/admin", events=["run.failed"], actor="test")
    message = str(refused.value)
    assert message == "url: the host resolves to an address that is not public"
    assert "127.0.0.1" not in message and "::1" not in message
    assert not tenant.webhooks.exists()
