"""A stand-in for vLLM's OpenAI-compatible server that samples nothing: every completion is
``max_tokens`` tokens, one every ``--token-delay-ms``, so what a gateway adds shows beyond what a
CPU vLLM can serve (the way gateways are measured against a mock provider).

The wire format is vLLM's own, as its server writes it (vllm/entrypoints/openai/completion/
protocol.py and serving.py): a whole completion's ``choices[]`` carry ``text``, ``logprobs``
(``text_offset``, ``token_logprobs``, ``tokens``, ``top_logprobs``), ``finish_reason``,
``stop_reason``, ``token_ids``, ``prompt_logprobs`` and ``prompt_token_ids``, beside ``usage``; a
stream sends one ``text_completion`` chunk per token (``prompt_token_ids`` on the first, null
after; ``token_ids`` always, as ``return_token_ids`` asks), then with ``include_usage`` a chunk
with empty ``choices`` and ``usage``, then ``data: [DONE]``. Prompt token ids are the prompt's
bytes. Also ``GET /health`` and ``GET /v1/models``.

    python benchmarks/mock_vllm.py --port 8199 --token-delay-ms 20 [--model base]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

Send = Any
Receive = Any


def _tokens(max_tokens: int) -> list[tuple[str, int]]:
    return [(f" t{i}", 1000 + i) for i in range(max_tokens)]


def _logprobs(tokens: list[tuple[str, int]], offset: int) -> dict[str, Any]:
    offsets, position = [], offset
    for text, _ in tokens:
        offsets.append(position)
        position += len(text)
    return {
        "text_offset": offsets,
        "token_logprobs": [-0.25] * len(tokens),
        "tokens": [text for text, _ in tokens],
        "top_logprobs": [{text: -0.25} for text, _ in tokens],
    }


def _usage(prompt: list[int], completion: int) -> dict[str, Any]:
    return {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + completion, "completion_tokens": completion}


class MockVLLM:
    def __init__(self, model: str, token_delay_s: float) -> None:
        self.model, self.delay = model, token_delay_s

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/health":
            await self._json(send, 200, {})
        elif method == "GET" and path == "/v1/models":
            card = {"id": self.model, "object": "model", "root": self.model, "parent": None, "max_model_len": 2048}
            await self._json(send, 200, {"object": "list", "data": [card]})
        elif method == "POST" and path == "/v1/completions":
            await self._completion(json.loads(body), send)
        else:
            await self._json(
                send, 404, {"error": {"message": f"no {method} {path}", "type": "NotFoundError", "code": 404}}
            )

    async def _json(self, send: Send, status: int, data: Any) -> None:
        payload = json.dumps(data).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _completion(self, request: dict[str, Any], send: Send) -> None:
        prompt = request.get("prompt", "")
        prompt_ids = list(prompt.encode()) if isinstance(prompt, str) else list(prompt)
        tokens = _tokens(int(request.get("max_tokens") or 16))
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}
        head["model"] = request.get("model") or self.model
        if not request.get("stream"):
            await asyncio.sleep(self.delay * len(tokens))
            choice = {
                "index": 0,
                "text": "".join(text for text, _ in tokens),
                "logprobs": _logprobs(tokens, 0),
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": [token for _, token in tokens],
                "prompt_logprobs": None,
                "prompt_token_ids": prompt_ids,
            }
            usage = {**_usage(prompt_ids, len(tokens)), "prompt_tokens_details": None}
            answer = {**head, "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": usage}
            await self._json(send, 200, {**answer, "kv_transfer_params": None})
            return
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        offset = 0
        for index, (text, token) in enumerate(tokens):
            await asyncio.sleep(self.delay)
            last = index == len(tokens) - 1
            choice = {
                "index": 0,
                "text": text,
                "logprobs": _logprobs([(text, token)], offset),
                "finish_reason": "length" if last else None,
                "stop_reason": None,
                "prompt_token_ids": prompt_ids if index == 0 else None,
                "token_ids": [token],
            }
            offset += len(text)
            event = b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if (request.get("stream_options") or {}).get("include_usage"):
            usage_chunk = {**head, "choices": [], "usage": _usage(prompt_ids, len(tokens))}
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + json.dumps(usage_chunk).encode() + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-delay-ms", type=float, default=20.0)
    parser.add_argument("--model", default="base")
    args = parser.parse_args()
    app = MockVLLM(args.model, args.token_delay_ms / 1000)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", backlog=4096, timeout_keep_alive=75)


if __name__ == "__main__":
    main()
