"""Drive a step generator (:func:`strop._core.attempts` and what wraps it) with real I/O: send the
requests it yields, sleep the sleeps it yields, hand back responses or throw transport errors in.
Everything else about a call (when to retry, how long to wait, which error) is decided in
``_core``, once for both clients and the feedback batchers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Callable, TypeVar

import httpx

from strop._core import Sleep, Steps

R = TypeVar("R")


async def run_async(
    http: httpx.AsyncClient,
    steps: Steps[R],
    *,
    stream: bool = False,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    before_send: Callable[[httpx.Request], None] | None = None,
) -> R:
    try:
        step = next(steps)
        while True:
            if isinstance(step, Sleep):
                await sleep(step.seconds)
                step = steps.send(None)
                continue
            if before_send is not None:
                before_send(step)
            try:
                response = await http.send(step, stream=stream)
            except httpx.TransportError as exc:
                step = steps.throw(exc)
                continue
            if stream and response.status_code >= 400:
                try:
                    await response.aread()  # the error body, for the typed error
                finally:
                    await response.aclose()
            step = steps.send(response)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
