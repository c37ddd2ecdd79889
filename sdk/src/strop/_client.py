"""The sync client. Each method builds its call with ``_api`` and runs it; nothing else happens here."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import httpx

from strop import _api
from strop._batch_core import BatcherOptions
from strop._batcher import FeedbackBatcher
from strop._core import DEFAULT_MAX_RETRIES, Call, ClientConfig, RetryPolicy, attempts
from strop._drivers import run_sync
from strop._management_types import Adapter, Assignment, EndUser, Experiment, Model
from strop._streaming import ChatCompletionStream, CompletionStream
from strop._types import (
    BatchResult,
    ChatCompletion,
    Completion,
    Interaction,
    ItemResult,
    Page,
)

T = TypeVar("T")

__all__ = ["Strop"]


class Strop:
    """Client of the Strop API.

    ``base_url`` defaults to ``$STROP_BASE_URL`` (else ``http://127.0.0.1:8000``), ``api_key`` to
    ``$STROP_API_KEY``. ``timeout`` is seconds (or an ``httpx.Timeout``); ``max_retries`` is how
    many times a failed call is tried again (429, 502, 503, 504, connection errors). Pass your own
    ``http_client`` (an ``httpx.Client``) for proxies, certificates or transports; the client then
    leaves closing it to you. ``feedback_batching`` configures ``client.feedback.enqueue``.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.Client | None = None,
        feedback_batching: BatcherOptions | None = None,
    ) -> None:
        self._config = ClientConfig.build(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries)
        self._policy = RetryPolicy(max_retries=max_retries)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=self._config.http_timeout)
        self.completions = Completions(self)
        self.chat = Chat(self)
        self.interactions = Interactions(self)
        self.feedback = Feedback(self, feedback_batching)
        self.users = Users(self)
        self.experiments = Experiments(self)
        self.adapters = Adapters(self)
        self.models = Models(self)

    @property
    def base_url(self) -> str:
        return self._config.base_url

    def _run(self, call: Call[T]) -> T:
        request = call.build(self._config, self._http)
        steps = attempts(request, self._policy, idempotent=call.idempotent)
        return call.parse(run_sync(self._http, steps, stream=call.stream))

    def close(self) -> None:
        """Flush queued feedback (within its ``close_timeout``), then close the HTTP client if it is ours."""
        self.feedback._close()
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Strop:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _Resource:
    def __init__(self, client: Strop) -> None:
        self._client = client


class Completions(_Resource):
    @overload
    def create(
        self,
        *,
        model: str | None = None,
        prompt: str | None = None,
        prefix: str | None = None,
        suffix: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | Sequence[str] | None = None,
        n: int | None = None,
        seed: int | None = None,
        user: str | None = None,
        opted_in: bool | None = None,
        stream: Literal[False] = False,
    ) -> Completion: ...

    @overload
    def create(
        self,
        *,
        model: str | None = None,
        prompt: str | None = None,
        prefix: str | None = None,
        suffix: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | Sequence[str] | None = None,
        n: int | None = None,
        seed: int | None = None,
        user: str | None = None,
        opted_in: bool | None = None,
        stream: Literal[True],
    ) -> CompletionStream: ...

    def create(
        self,
        *,
        model: str | None = None,
        prompt: str | None = None,
        prefix: str | None = None,
        suffix: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | Sequence[str] | None = None,
        n: int | None = None,
        seed: int | None = None,
        user: str | None = None,
        opted_in: bool | None = None,
        stream: bool = False,
    ) -> Completion | CompletionStream:
        """A completion from the tenant's adapter (``model``; None: the default adapter). Send
        ``prompt``, or ``prefix`` (+ ``suffix``) for fill-in-the-middle. ``stream=True`` returns a
        :class:`CompletionStream` of chunks."""
        call = _api.completion_create(
            model=model,
            prompt=prompt,
            prefix=prefix,
            suffix=suffix,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=stop,
            n=n,
            seed=seed,
            user=user,
            opted_in=opted_in,
            stream=stream,
        )
        result = self._client._run(call)
        return CompletionStream(result) if stream else result


class ChatCompletions(_Resource):
    @overload
    def create(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | Sequence[str] | None = None,
        n: int | None = None,
        seed: int | None = None,
        user: str | None = None,
        opted_in: bool | None = None,
        conversation_id: str | None = None,
        turn: int | None = None,
        stream: Literal[False] = False,
    ) -> ChatCompletion: ...

    @overload
    def create(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | Sequence[str] | None = None,
        n: int | None = None,
        seed: int | None = None,
        user: str | None = None,
        opted_in: bool | None = None,
        conversation_id: str | None = None,
        turn: int | None = None,
        stream: Literal[True],
    ) -> ChatCompletionStream: ...

    def create(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: str | Sequence[str] | None = None,
        n: int | None = None,
        seed: int | None = None,
        user: str | None = None,
        opted_in: bool | None = None,
        conversation_id: str | None = None,
        turn: int | None = None,
        stream: bool = False,
    ) -> ChatCompletion | ChatCompletionStream:
        """A chat completion from the tenant's adapter (agents): OpenAI's ``messages`` (and
        ``tools``), rendered with the base model's chat template. ``conversation_id`` makes the
        session one thread; ``turn`` defaults to the assistant messages before this reply. Each
        choice's ``interaction_id`` is the turn to send feedback on. ``stream=True`` returns a
        :class:`ChatCompletionStream` of chunks."""
        call = _api.chat_create(
            messages=messages,
            model=model,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=stop,
            n=n,
            seed=seed,
            user=user,
            opted_in=opted_in,
            conversation_id=conversation_id,
            turn=turn,
            stream=stream,
        )
        result = self._client._run(call)
        return ChatCompletionStream(result) if stream else result


class Chat(_Resource):
    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.completions = ChatCompletions(client)


class Interactions(_Resource):
    def log(
        self,
        *,
        client_id: str,
        completion: str,
        prompt: str | None = None,
        prefix: str | None = None,
        suffix: str | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        completion_token_ids: Sequence[int] | None = None,
        completion_logprobs: Sequence[float] | None = None,
        model: str | None = None,
        end_user_id: str | None = None,
        opted_in: bool | None = None,
        served_at: datetime | str | None = None,
        latency_ms: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        conversation_id: str | None = None,
        turn: int | None = None,
    ) -> Interaction:
        """Log one completion served elsewhere: for a ``prompt`` (or ``prefix``), or an agent's
        reply to ``messages`` (with ``tools``, its session's ``conversation_id`` and ``turn``).
        Sending a ``client_id`` again stores nothing and returns the first interaction
        (``created`` False)."""
        item = _api.interaction_item(
            client_id=client_id,
            completion=completion,
            prompt=prompt,
            prefix=prefix,
            suffix=suffix,
            prompt_token_ids=prompt_token_ids,
            completion_token_ids=completion_token_ids,
            completion_logprobs=completion_logprobs,
            model=model,
            end_user_id=end_user_id,
            opted_in=opted_in,
            served_at=served_at,
            latency_ms=latency_ms,
            metadata=metadata,
            messages=messages,
            tools=tools,
            conversation_id=conversation_id,
            turn=turn,
        )
        return self._client._run(_api.interaction_log(item))

    def log_batch(self, items: Iterable[Mapping[str, Any]]) -> BatchResult:
        """Log up to 1000 interactions (dicts with ``log``'s fields) in one call; one verdict each."""
        return self._client._run(_api.interaction_log_batch(items))

    def get(self, interaction_id: str) -> Interaction:
        return self._client._run(_api.interaction_get(interaction_id))

    def list(
        self, *, end_user_id: str | None = None, limit: int | None = None, offset: int | None = None
    ) -> Page[Interaction]:
        """One page, newest first (``limit`` default 50, at most 500); next: ``offset=page.next_offset``."""
        return self._client._run(_api.interaction_list(end_user_id=end_user_id, limit=limit, offset=offset))


class Feedback(_Resource):
    def __init__(self, client: Strop, options: BatcherOptions | None) -> None:
        super().__init__(client)
        self._options = options
        self._batcher: FeedbackBatcher | None = None

    def send(
        self,
        *,
        outcome: str,
        interaction_id: str | None = None,
        client_id: str | None = None,
        kept_text: str | None = None,
        occurred_at: datetime | str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> ItemResult:
        """Record one event now: ``status`` is ``recorded``, or ``pending`` when its interaction
        (named by ``client_id``) has not arrived yet."""
        item = _api.feedback_item(
            outcome=outcome,
            interaction_id=interaction_id,
            client_id=client_id,
            kept_text=kept_text,
            occurred_at=occurred_at,
            metadata=metadata,
        )
        return self._client._run(_api.feedback_send(item))

    def session_outcome(
        self,
        *,
        conversation_id: str,
        turn: int,
        outcome: str,
        discount: float | None = None,
        occurred_at: datetime | str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> ItemResult:
        """How an agent session ended (``thumbs_up``, ``follow_up_dissatisfied``...), after its
        ``turn``: that turn gets the outcome's reward, each earlier one ``discount ** distance``
        of it (default 0: that turn only). A turn's own feedback always wins."""
        item = _api.feedback_item(
            outcome=outcome,
            conversation_id=conversation_id,
            turn=turn,
            discount=discount,
            occurred_at=occurred_at,
            metadata=metadata,
        )
        return self._client._run(_api.feedback_send(item))

    def send_batch(self, items: Iterable[Mapping[str, Any]]) -> BatchResult:
        """Record up to 1000 events (dicts with ``send``'s fields) in one call; one verdict each."""
        return self._client._run(_api.feedback_send_batch(items))

    def enqueue(
        self,
        *,
        outcome: str,
        interaction_id: str | None = None,
        client_id: str | None = None,
        kept_text: str | None = None,
        occurred_at: datetime | str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue one event for the background batcher and return at once (never blocks)."""
        item = _api.feedback_item(
            outcome=outcome,
            interaction_id=interaction_id,
            client_id=client_id,
            kept_text=kept_text,
            occurred_at=occurred_at,
            metadata=metadata,
        )
        self.batcher.enqueue(item)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event enqueued so far was delivered, rejected or failed."""
        return self._batcher.flush(timeout) if self._batcher is not None else True

    @property
    def batcher(self) -> FeedbackBatcher:
        """The background batcher (created on first use): ``stats``, ``rejected``, ``failures``."""
        if self._batcher is None:
            self._batcher = FeedbackBatcher(http=self._client._http, config=self._client._config, options=self._options)
        return self._batcher

    def _close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()


class Users(_Resource):
    """End users of the tenant (by your own id) and their consent to be learned from."""

    def opt_in(self, end_user_id: str) -> EndUser:
        return self._client._run(_api.user_opt_in(end_user_id))

    def opt_out(self, end_user_id: str) -> EndUser:
        return self._client._run(_api.user_opt_out(end_user_id))

    def get(self, end_user_id: str) -> EndUser:
        return self._client._run(_api.user_get(end_user_id))

    def list(
        self,
        *,
        search: str | None = None,
        opted_in: bool | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Page[EndUser]:
        return self._client._run(_api.user_list(search=search, opted_in=opted_in, limit=limit, offset=offset))

    def import_(self, items: Iterable[Mapping[str, Any]]) -> BatchResult:
        """Set many users' opt-in state: items ``{"end_user_id", "opted_in"}``; one verdict each."""
        return self._client._run(_api.user_import(items))

    def erase(self, end_user_id: str) -> dict[str, Any]:
        """Delete the user's interactions, feedback and history; the API's report (may be empty)."""
        return self._client._run(_api.user_erase(end_user_id))


class Experiments(_Resource):
    def list(self, adapter: str) -> builtins.list[Experiment]:
        return self._client._run(_api.experiment_list(adapter))

    def get(self, experiment_id: str | int) -> Experiment:
        return self._client._run(_api.experiment_get(experiment_id))

    def assignment(self, adapter: str, user: str) -> Assignment:
        """Which arm serves ``user`` (your end-user id) on ``adapter`` now."""
        return self._client._run(_api.experiment_assignment(adapter, user))


class Adapters(_Resource):
    def list(self) -> builtins.list[Adapter]:
        return self._client._run(_api.adapter_list())


class Models(_Resource):
    def list(self) -> builtins.list[Model]:
        return self._client._run(_api.model_list())
