"""The SDK against the real API: pytest-django's ``live_server`` serves the app on a real port
against the test database (so tests that use it are transactional), with the real Redis."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from strop import Strop


@dataclass
class Api:
    url: str
    tenant: Any
    key: str


@pytest.fixture
def make_api(live_server: Any, make_tenant: Callable[..., Any], make_client: Callable[..., Any]) -> Callable[..., Api]:
    """``make(scopes=None, **tenant_fields)``: a fresh tenant on the live server and a key for it."""

    def make(scopes: list[str] | None = None, **tenant_fields: Any) -> Api:
        tenant = make_tenant(f"sdk-{uuid.uuid4().hex[:8]}", **tenant_fields)
        return Api(url=live_server.url, tenant=tenant, key=make_client(tenant, scopes=scopes).raw_key)

    return make


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api()


@pytest.fixture
def strop_client(api: Api) -> Iterator[Strop]:
    client = Strop(base_url=api.url, api_key=api.key, timeout=60)
    yield client
    client.close()


@pytest.fixture
def tab_adapter(api: Api, tiny_starter_model: Any) -> Any:
    """The adapter ``tab`` of ``api``'s tenant on the tiny starter model (nothing served: no vLLM)."""
    from apps.adapters.services import adapter_create, base_model_register

    base = base_model_register(name="base", path=tiny_starter_model)
    return adapter_create(api.tenant, name="tab", base_model=base, is_default=True)


@pytest.fixture
def admin_sdk(
    live_server: Any, serving_tenant: Any, serving_adapter: Any, make_client: Callable[..., Any]
) -> Iterator[Strop]:
    """An SDK client with every scope for the serving tenant (its default adapter ``autocomplete``
    on the session's real vLLM)."""
    key = make_client(serving_tenant).raw_key
    with Strop(base_url=live_server.url, api_key=key, timeout=120) as client:
        yield client


@pytest.fixture
def probed_version(serving_tenant: Any, serving_adapter: Any, make_lora_adapter: Any, base_model: Any) -> Any:
    """``make(seed, parent=None)``: a random LoRA registered as a candidate, loaded in vLLM, with the
    serve probe the trainer would have recorded (as tests/experiments/conftest.py makes them)."""
    from apps.adapters.loading import adapter_version_load
    from apps.adapters.services import adapter_serve_probe, adapter_version_register

    def make(seed: int, parent: Any = None) -> Any:
        source = make_lora_adapter(seed=seed)
        probe = adapter_serve_probe(base_model, source)
        version = adapter_version_register(
            serving_tenant,
            adapter=serving_adapter,
            source_dir=source,
            parent=parent,
            enqueue_load=False,
            metrics={"serve_probe": probe},
        )
        assert adapter_version_load(version_id=version.pk) == "loaded"
        version.refresh_from_db()
        return version

    return make


@dataclass
class Traffic:
    """What an ``httpx`` client sent and got, from its event hooks (nothing is intercepted)."""

    events: list[tuple[float, str, str, int | None, str | None]] = field(default_factory=list)
    clients: list[httpx.Client | httpx.AsyncClient] = field(default_factory=list)

    def on_request(self, request: httpx.Request) -> None:
        self.events.append((time.monotonic(), "request", request.url.path, None, None))

    def on_response(self, response: httpx.Response) -> None:
        path = response.request.url.path
        self.events.append(
            (time.monotonic(), "response", path, response.status_code, response.headers.get("retry-after"))
        )

    def requests(self, path: str | None = None) -> int:
        return sum(1 for _, kind, p, _, _ in self.events if kind == "request" and (path is None or p == path))

    def statuses(self, path: str) -> list[int | None]:
        return [status for _, kind, p, status, _ in self.events if kind == "response" and p == path]

    def client(self, **kwargs: Any) -> httpx.Client:
        client = httpx.Client(event_hooks={"request": [self.on_request], "response": [self.on_response]}, **kwargs)
        self.clients.append(client)
        return client

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        async def on_request(request: httpx.Request) -> None:
            self.on_request(request)

        async def on_response(response: httpx.Response) -> None:
            self.on_response(response)

        client = httpx.AsyncClient(event_hooks={"request": [on_request], "response": [on_response]}, **kwargs)
        self.clients.append(client)
        return client


@pytest.fixture
def traffic() -> Iterator[Traffic]:
    """Closes its sync clients at the end (an async one must be closed on its own loop): a
    kept-alive connection holds a live-server thread and its database connection open, which
    would keep the test database from being dropped."""
    traffic = Traffic()
    yield traffic
    for client in traffic.clients:
        if isinstance(client, httpx.Client):
            client.close()
        else:
            assert client.is_closed, "close the AsyncClient inside its event loop"


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A server that accepts connections (the kernel's backlog does) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
