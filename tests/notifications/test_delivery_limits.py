"""A webhook receiver cannot hold a worker, a transaction or its memory, and cannot move the
connection elsewhere: the delivery is claimed and committed before the call, the call ends at one
total deadline whatever the receiver trickles, at most a capped part of the answer is read, and the
connection goes to the address vetted when the name was resolved, with TLS and Host naming the host.
Every receiver is a real server on loopback (allowed here by STROP_WEBHOOK_ALLOW_PRIVATE only)."""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection

from apps.notifications.models import WebhookDelivery
from apps.notifications.services import notification_send, webhook_create, webhook_deliver
from apps.notifications.transport import post_pinned
from tests.fixtures.workers import wait_until
from tests.notifications.receivers import (
    RawReceiver,
    huge_body,
    self_signed_certificate,
    tls_server_context,
    trickle,
)


@pytest.fixture
def raw_receivers() -> Iterator[list[RawReceiver]]:
    made: list[RawReceiver] = []
    yield made
    for receiver in made:
        receiver.close()


class Recording(BaseHTTPRequestHandler):
    """Answers 200 and records the request; ``during`` (set per server) runs while the request is open."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((dict(self.headers), body))  # type: ignore[attr-defined]
        during = getattr(self.server, "during", None)
        if during is not None:
            self.server.seen.append(during(json.loads(body)))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    server.received, server.seen = [], []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _one_delivery(tenant, url: str, **create) -> WebhookDelivery:
    webhook_create(tenant, url=url, events=["run.failed"], actor="test", **create)
    [delivery] = notification_send(tenant, event="run.failed", data={"run": 1})
    return delivery


@pytest.mark.django_db
def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_total_deadline(
    make_tenant, local_endpoints, raw_receivers, settings
):
    settings.STROP_WEBHOOK_TIMEOUT_S = 1.5
    # A byte every 0.1 s: no single read waits anywhere near the deadline, and the whole answer
    # (a 200, padded) would take ~25 s.
    answer = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 200 + b"\r\nContent-Length: 0\r\n\r\n"
    receiver = RawReceiver(trickle(answer, every_s=0.1))
    raw_receivers.append(receiver)
    delivery = _one_delivery(make_tenant("hooks-trickle"), receiver.url)

    attempt = webhook_deliver(delivery.pk)

    delivery.refresh_from_db()
    assert attempt.status == "pending" and attempt.retry_in is not None
    assert (delivery.status, delivery.response_status) == ("pending", None)
    assert delivery.error == "no complete answer within 1.5 s"
    wait_until(lambda: receiver.finished, timeout=60, what="the receiver to notice")
    assert receiver.finished == [False]  # Strop hung up before the receiver got its answer out


@pytest.mark.django_db
def test_a_200_whose_body_trickles_is_delivered_and_let_go_at_the_deadline(
    make_tenant, local_endpoints, raw_receivers, settings
):
    settings.STROP_WEBHOOK_TIMEOUT_S = 1.5
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 300\r\n\r\n"

    def answer_then_trickle(conn) -> None:
        conn.sendall(head)
        trickle(b"b" * 300, every_s=0.1)(conn)

    receiver = RawReceiver(answer_then_trickle)
    raw_receivers.append(receiver)
    delivery = _one_delivery(make_tenant("hooks-trickle-body"), receiver.url)

    assert webhook_deliver(delivery.pk).status == "delivered"  # the status is the answer

    wait_until(lambda: receiver.finished, timeout=60, what="the receiver to notice")
    assert receiver.finished == [False]


@pytest.mark.django_db
def test_only_a_capped_part_of_a_huge_answer_is_read(make_tenant, local_endpoints, raw_receivers, settings):
    settings.STROP_WEBHOOK_TIMEOUT_S = 120  # the cap must end it, not the deadline
    settings.STROP_WEBHOOK_MAX_RESPONSE_BYTES = 64 * 1024
    receiver = RawReceiver(huge_body)
    raw_receivers.append(receiver)
    delivery = _one_delivery(make_tenant("hooks-endless"), receiver.url)

    assert webhook_deliver(delivery.pk).status == "delivered"  # the status line is the answer

    delivery.refresh_from_db()
    assert (delivery.response_status, delivery.error) == (200, "")
    wait_until(lambda: receiver.sent, timeout=60, what="the receiver to notice")
    assert receiver.finished == [False]
    # What the receiver got out before Strop hung up: the cap plus what the sockets buffer, never more.
    assert receiver.sent[0] < 32 * 1024 * 1024


@pytest.mark.django_db(transaction=True)
def test_a_delivery_is_committed_as_claimed_before_the_receiver_is_called(make_tenant, local_endpoints, http_server):
    def row_seen_from_another_connection(body: dict) -> tuple[str, int, bool]:
        try:  # this thread has a connection of its own: it sees only what is committed
            row = WebhookDelivery.objects.get(pk=body["id"])
            return row.status, row.attempts, row.claimed_at is not None
        finally:
            connection.close()

    http_server.during = row_seen_from_another_connection  # type: ignore[attr-defined]
    port = http_server.server_address[1]
    delivery = _one_delivery(make_tenant("hooks-claim"), f"http://127.0.0.1:{port}/hook")

    assert webhook_deliver(delivery.pk).status == "delivered"

    assert http_server.seen == [("sending", 1, True)]  # type: ignore[attr-defined]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.claimed_at) == ("delivered", 1, None)


@pytest.mark.django_db
def test_the_connection_goes_to_the_vetted_address_even_if_the_name_resolves_elsewhere_later(
    make_tenant, local_endpoints, http_server
):
    port = http_server.server_address[1]
    answers = {"count": 0}

    def rebinding(host: str, port: int) -> list[str]:
        """First the receiver's address; any later lookup another one (nothing listens there)."""
        answers["count"] += 1
        return ["127.0.0.1"] if answers["count"] % 2 == 1 else ["127.0.0.2"]

    tenant = make_tenant("hooks-rebind")
    url = f"http://hooks.rebind.test:{port}/hook"  # a name no real resolver knows
    webhook_create(tenant, url=url, events=["run.failed"], actor="test", resolver=rebinding)
    [delivery] = notification_send(tenant, event="run.failed", data={})
    answers["count"] = 0

    assert webhook_deliver(delivery.pk, resolver=rebinding).status == "delivered"

    assert answers["count"] == 1  # resolved once per attempt; nothing else resolved the name
    [(headers, _)] = http_server.received  # type: ignore[attr-defined]
    assert headers["Host"] == f"hooks.rebind.test:{port}"


@pytest.mark.django_db
def test_a_name_that_resolves_to_a_private_address_at_delivery_time_is_not_called(make_tenant, settings):
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = False
    tenant = make_tenant("hooks-rebind-private")
    public_then_internal = iter([["93.184.216.34"], ["10.0.0.5"]])

    def resolver(host: str, port: int) -> list[str]:
        return next(public_then_internal)

    webhook_create(tenant, url="https://hooks.rebind.test/hook", events=["run.failed"], actor="test", resolver=resolver)
    [delivery] = notification_send(tenant, event="run.failed", data={})

    assert webhook_deliver(delivery.pk, resolver=resolver).status == "pending"

    delivery.refresh_from_db()
    assert delivery.error == "not sent: the host resolves to an address that is not public"


def test_tls_names_the_host_while_the_connection_goes_to_the_vetted_address(tmp_path, monkeypatch):
    cert, key = self_signed_certificate(tmp_path, "hooks.pinned.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client trusts this one certificate
    seen_sni: list[str | None] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    server.received, server.seen = [], []  # type: ignore[attr-defined]
    server.socket = tls_server_context(cert, key, seen_sni).wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        result = post_pinned(
            f"https://hooks.pinned.test:{port}/hook",
            host="hooks.pinned.test",
            addresses=[ipaddress.ip_address("127.0.0.1")],
            body=b"{}",
            headers={"Content-Type": "application/json"},
            deadline_s=30,
            max_response_bytes=1024,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert (result.status, result.error) == (200, "")
    assert seen_sni == ["hooks.pinned.test"]  # SNI named the host, and its certificate was checked for it
    [(headers, _)] = server.received  # type: ignore[attr-defined]
    assert headers["Host"] == f"hooks.pinned.test:{port}"
