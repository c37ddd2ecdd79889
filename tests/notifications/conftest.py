"""Fixtures of the webhook tests: receivers that are real HTTP servers on loopback, and loopback
allowed (STROP_WEBHOOK_ALLOW_PRIVATE) here and in the workers a test starts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Receiver:
    """An HTTP endpoint that answers each POST with the next status of ``answers`` (then 200)."""

    def __init__(self, answers: list[int]) -> None:
        self.answers, self.received = list(answers), []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((dict(self.headers), body))
                self.send_response(receiver.answers.pop(0) if receiver.answers else 200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made: list[Receiver] = []

    def make(answers: list[int]) -> Receiver:
        made.append(Receiver(answers))
        return made[-1]

    yield make  # type: ignore[misc]
    for r in made:
        r.server.shutdown()


@pytest.fixture
def local_endpoints(settings, monkeypatch):
    """Endpoints on 127.0.0.1 allowed, here and in the workers this test starts."""
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = True
    monkeypatch.setenv("STROP_WEBHOOK_ALLOW_PRIVATE", "true")
