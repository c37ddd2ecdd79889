"""The client: settings, the connection pool, and ``_run``, which sends a described call
(``_api``) through the retry loop (``_core``). The resources it carries only build calls."""

# unasync: _client.py is generated from this file. Edit here, then run sdk/scripts/unasync.py.

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import TypeVar

import httpx

from strop._async_completions import AsyncChat, AsyncCompletions
from strop._async_drivers import run_async
from strop._async_experiments import AsyncExperiments
from strop._async_management import (
    AsyncAdapters,
    AsyncAuditEvents,
    AsyncEvalSets,
    AsyncKeys,
    AsyncTenantResource,
    AsyncTrainingPolicies,
    AsyncTrainingRuns,
)
from strop._async_resources import (
    AsyncEditor,
    AsyncFeedback,
    AsyncHealthResource,
    AsyncInteractions,
    AsyncModels,
    AsyncUsers,
)
from strop._batch_core import BatcherOptions
from strop._core import DEFAULT_MAX_RETRIES, Call, ClientConfig, RetryPolicy, attempts, merge_headers

T = TypeVar("T")

__all__ = ["AsyncStrop"]


class AsyncStrop:
    """Client of the Strop API, for asyncio: every call is awaited.

    Close it with ``await client.close()`` or use it in ``async with``.

    ``base_url`` defaults to ``$STROP_BASE_URL`` (else ``http://127.0.0.1:8000``), ``api_key`` to
    ``$STROP_API_KEY``. ``timeout`` is seconds (or an ``httpx.Timeout``); ``max_retries`` is how
    many times a failed call is tried again (429, 502, 503, 504, connection errors).
    ``default_headers`` are sent with every request. Pass your own ``http_client`` (an
    ``httpx.AsyncClient``) for proxies, certificates or transports; the client then leaves closing
    it to you. ``feedback_batching`` configures ``client.feedback.enqueue``.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        default_headers: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        feedback_batching: BatcherOptions | None = None,
    ) -> None:
        self._config = ClientConfig.build(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
        )
        self._policy = RetryPolicy(max_retries=max_retries)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=self._config.http_timeout)
        # serving, logging and feedback
        self.completions = AsyncCompletions(self)
        self.chat = AsyncChat(self)
        self.interactions = AsyncInteractions(self)
        self.feedback = AsyncFeedback(self, feedback_batching)
        self.editor = AsyncEditor(self)
        self.users = AsyncUsers(self)
        self.models = AsyncModels(self)
        self.health = AsyncHealthResource(self)
        # the tenant's management (key scope admin)
        self.tenant = AsyncTenantResource(self)
        self.keys = AsyncKeys(self)
        self.audit_events = AsyncAuditEvents(self)
        self.adapters = AsyncAdapters(self)
        self.training_policy = AsyncTrainingPolicies(self)
        self.training_runs = AsyncTrainingRuns(self)
        self.eval_sets = AsyncEvalSets(self)
        self.experiments = AsyncExperiments(self)

    @property
    def base_url(self) -> str:
        return self._config.base_url

    @property
    def timeout(self) -> httpx.Timeout | None:
        """The timeout given to this client (None: the HTTP client's own applies)."""
        return self._config.timeout

    @property
    def max_retries(self) -> int:
        return self._config.max_retries

    @property
    def default_headers(self) -> dict[str, str]:
        return dict(self._config.default_headers)

    def with_options(
        self,
        *,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int | None = None,
        default_headers: Mapping[str, str] | None = None,
    ) -> AsyncStrop:
        """This client with some settings changed (None keeps this client's), for one call or
        many: ``client.with_options(max_retries=5).interactions.get(id)``. ``default_headers`` are
        added to this client's, replacing those of the same name.

        The new client shares this one's connection pool and feedback batcher; closing it closes
        neither (this client still owns them), so it may be dropped without being closed."""
        derived = AsyncStrop(
            base_url=self._config.base_url,
            api_key=self._config.api_key,
            timeout=self._config.timeout if timeout is None else timeout,
            max_retries=self._config.max_retries if max_retries is None else max_retries,
            default_headers=merge_headers(self._config.default_headers, default_headers),
            http_client=self._http,
        )
        derived.feedback._share_batcher_of(self.feedback)
        return derived

    async def _run(self, call: Call[T]) -> T:
        request = call.build(self._config, self._http)
        steps = attempts(request, self._policy, idempotent=call.idempotent)
        return call.parse(await run_async(self._http, steps, stream=call.stream))

    async def close(self) -> None:
        """Flush queued feedback (within its ``close_timeout``), then close the HTTP client if it
        is ours. A client made by ``with_options`` owns neither: closing it does nothing."""
        await self.feedback._close()
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncStrop:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
