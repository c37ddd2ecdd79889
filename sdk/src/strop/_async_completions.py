"""Completions and chat completions: the calls with a ``stream`` switch, hence the overloads
(``stream=True`` returns a stream of chunks, otherwise the whole answer)."""

# unasync: _completions.py is generated from this file. Edit here, then run sdk/scripts/unasync.py.

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from strop import _api
from strop._async_resources import AsyncAPIResource
from strop._async_streaming import AsyncChatCompletionStream, AsyncCompletionStream
from strop._chat_types import ChatCompletion
from strop._types import Completion

if TYPE_CHECKING:
    from strop._async_client import AsyncStrop

__all__ = ["AsyncChat", "AsyncChatCompletions", "AsyncCompletions"]


class AsyncCompletions(AsyncAPIResource):
    @overload
    async def create(
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
    async def create(
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
    ) -> AsyncCompletionStream: ...

    async def create(
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
    ) -> Completion | AsyncCompletionStream:
        """A completion from the tenant's adapter (``model``; None: the default adapter). Send
        ``prompt``, or ``prefix`` (+ ``suffix``) for fill-in-the-middle. ``stream=True`` returns a
        :class:`AsyncCompletionStream` of chunks."""
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
        result = await self._client._run(call)
        return AsyncCompletionStream(result) if stream else result


class AsyncChatCompletions(AsyncAPIResource):
    @overload
    async def create(
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
    async def create(
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
    ) -> AsyncChatCompletionStream: ...

    async def create(
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
    ) -> ChatCompletion | AsyncChatCompletionStream:
        """A chat completion from the tenant's adapter (agents): OpenAI's ``messages`` (and
        ``tools``), rendered with the base model's chat template. ``conversation_id`` makes the
        session one thread; ``turn`` defaults to the assistant messages before this reply. Each
        choice's ``interaction_id`` is the turn to send feedback on. ``stream=True`` returns a
        :class:`AsyncChatCompletionStream` of chunks."""
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
        result = await self._client._run(call)
        return AsyncChatCompletionStream(result) if stream else result


class AsyncChat(AsyncAPIResource):
    def __init__(self, client: AsyncStrop) -> None:
        super().__init__(client)
        self.completions = AsyncChatCompletions(client)
