"""A chat choice as it is served: a whole answer, or the chunks of a stream joined, and what an
open stream's part takes of it since its last write (:mod:`apps.serving.stream_record`).
Used by :mod:`apps.serving.chat`."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from apps.interactions.served import ServedCompletion, model_text_storable
from apps.interactions.stream_parts import TOOL_CALLS_SINCE
from apps.serving.stream_record import Piece

# Where an open stream's part of a choice starts: the lengths of its content pieces, tokens and
# logprobs, and of each tool call (index, id, name, arguments' length).
_Cursor = tuple[int, int, int, tuple[tuple[int, str, str, int], ...]]


@dataclass
class ChoiceSoFar:
    """One choice as served so far (a whole answer, or the chunks of a stream joined)."""

    content: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None

    def add(self, choice: dict[str, Any], *, message_key: str) -> None:
        message = choice.get(message_key) or {}
        if message.get("content"):
            self.content.append(message["content"])
        for position, call in enumerate(message.get("tool_calls") or []):
            empty = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            slot = self.tool_calls.setdefault(int(call.get("index", position)), empty)
            slot["id"] = call.get("id") or slot["id"]
            function = call.get("function") or {}
            # The model wrote them, and they are kept in jsonb metadata (whole, and in a stream's parts).
            slot["function"]["name"] += model_text_storable(function.get("name") or "")
            slot["function"]["arguments"] += model_text_storable(function.get("arguments") or "")
        self.token_ids.extend(int(t) for t in choice.get("token_ids") or [])
        entries = (choice.get("logprobs") or {}).get("content") or []
        self.logprobs.extend(float(entry["logprob"]) for entry in entries)
        self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def since(self, cursor: _Cursor | None) -> tuple[Piece, _Cursor] | None:
        """What was served since ``cursor`` (an open stream's part: ``apps.serving.stream_record``):
        of a tool call, only the arguments' new text (its id and name when they changed), joined
        again by ``apps.interactions.stream_parts``: a part never copies what an earlier one holds."""
        content, tokens, logprobs, calls_then = cursor or (0, 0, 0, ())
        calls_now = tuple(
            (index, call["id"], call["function"]["name"], len(call["function"]["arguments"]))
            for index, call in sorted(self.tool_calls.items())
        )
        now = (len(self.content), len(self.token_ids), len(self.logprobs), calls_now)
        if now == (content, tokens, logprobs, calls_then) and cursor is not None:
            return None
        metadata: dict[str, Any] = {"finish_reason": self.finish_reason} if self.finish_reason else {}
        before = {index: (call_id, name, length) for index, call_id, name, length in calls_then}
        deltas = []
        for index, call_id, name, length in calls_now:
            then_id, then_name, then_length = before.get(index, ("", "", 0))
            if (call_id, name, length) == (then_id, then_name, then_length):
                continue
            delta: dict[str, Any] = {
                "index": index,
                "arguments": self.tool_calls[index]["function"]["arguments"][then_length:],
            }
            if call_id != then_id:
                delta["id"] = call_id
            if name != then_name:
                delta["name"] = name
            deltas.append(delta)
        if deltas:
            metadata[TOOL_CALLS_SINCE] = deltas
        text = "".join(self.content[content:])
        return Piece(text, self.token_ids[tokens:], self.logprobs[logprobs:], metadata), now

    def served(self, interaction_id: uuid.UUID) -> ServedCompletion:
        logprobs = self.logprobs if len(self.logprobs) == len(self.token_ids) else []
        calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return ServedCompletion(
            interaction_id, "".join(self.content), self.token_ids, logprobs, self.finish_reason, calls or None
        )
