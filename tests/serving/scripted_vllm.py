"""A vLLM stand-in whose answers each test writes (the ``scripted_vllm`` fixture, conftest.py): what
benchmarks/mock_vllm.py (the serving tests' paced upstream) never does: fail, keep a request
waiting, answer chat, know which models it has, or write what only a model writes (a NUL byte, a
tool call)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

# (path, body) -> (status, answer): a JSON object, or a list of them sent as server-sent events.
Script = Callable[[str, dict[str, Any]], tuple[int, Any]]


def vllm_error(status: int, message: str, kind: str) -> tuple[int, Any]:
    """An error as vLLM's server answers it."""
    return status, {"error": {"message": message, "type": kind, "code": status}}


@dataclass
class ScriptedVLLM:
    """``script`` answers every POST (after ``delay_s``); ``models``: what ``GET /v1/models`` lists;
    ``asked``: each POST's (path, body), in order."""

    url: str = ""
    script: Script = lambda path, body: vllm_error(404, f"nothing at {path}", "NotFoundError")
    delay_s: float = 0.0
    models: list[str] = field(default_factory=list)
    asked: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def scripted_handler(upstream: ScriptedVLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            cards = [{"id": m, "object": "model", "root": m, "parent": None} for m in upstream.models]
            self._send(200, {"object": "list", "data": cards})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            upstream.asked.append((self.path, body))
            time.sleep(upstream.delay_s)
            self._send(*upstream.script(self.path, body))

        def _send(self, status: int, answer: Any) -> None:
            if isinstance(answer, list):  # a stream: one event per object, then [DONE]
                data = "".join(f"data: {json.dumps(event)}\n\n" for event in answer) + "data: [DONE]\n\n"
                payload, kind = data.encode(), "text/event-stream"
            else:
                payload, kind = json.dumps(answer).encode(), "application/json"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def completion_answer(model: str, text: str, *, logprob: float = -0.25) -> dict[str, Any]:
    """A whole completion as vLLM answers one (one token per character of ``text``)."""
    tokens = list(text)
    choice = {
        "index": 0,
        "text": text,
        "logprobs": {
            "text_offset": list(range(len(tokens))),
            "token_logprobs": [logprob] * len(tokens),
            "tokens": tokens,
            "top_logprobs": [{t: logprob} for t in tokens],
        },
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": [1000 + i for i in range(len(tokens))],
        "prompt_token_ids": [1, 2, 3],
    }
    usage = {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}
    return {"id": "cmpl-1", "object": "text_completion", "model": model, "choices": [choice], "usage": usage}
