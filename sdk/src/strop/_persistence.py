"""A persistence tracker for editor plugins: after an accept, read what is at the insertion point at
30 s, 2 min and 10 min and report it, so Strop can measure how much of the completion the developer
kept (retained characters).

Nothing here runs on the caller's thread but ``track``, which only records the accept: a daemon
thread wakes when the next checkpoint is due, calls the plugin's reader, and sends every report due
in one batch. The clock is injectable, and ``background=False`` leaves the timing to the caller
(``report_due``), for tests and for plugins that have a timer of their own."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from strop._exceptions import APIError

if TYPE_CHECKING:
    from strop._client import Strop

log = logging.getLogger("strop.persistence")

DEFAULT_CHECKPOINTS = (30, 120, 600)  # seconds after the accept
MAX_TEXT = 20_000  # what the API takes; a longer document is cut to a window around the completion
MAX_TRACKED = 1_000  # accepts tracked at once; the oldest is dropped beyond it

# What the reader returns: the text at the insertion point (or the document), or a share (0 to 1)
# the plugin measured itself; None when the document is gone (closed unsaved: nothing is reported).
Reading = str | float | None


@dataclass
class _Accept:
    accepted_at: float
    read: Callable[[], Reading]
    name: dict[str, str]
    accepted_text: str | None
    accepted_chars: int | None
    due: list[int] = field(default_factory=list)


def window(text: str, accepted_text: str | None, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters around where the accepted text starts (its start if it
    is not found there), so a long document still carries the completion."""
    if len(text) <= limit:
        return text
    found = text.find(accepted_text[:64]) if accepted_text else -1
    start = max(0, min(found - (limit - len(accepted_text or "")) // 2, len(text) - limit)) if found >= 0 else 0
    return text[start : start + limit]


class PersistenceTracker:
    """Reports what is left of accepted completions at checkpoints after each accept.

    ``tracker.track(interaction_id=..., read=lambda: buffer_text())`` when the developer accepts;
    the tracker calls ``read`` at each checkpoint (from its own thread: ``read`` must be safe to call
    there, and quick) and sends the reports through ``client``. A failed send is logged and dropped:
    a later checkpoint still reports."""

    def __init__(
        self,
        client: Strop,
        *,
        checkpoints: Sequence[int] = DEFAULT_CHECKPOINTS,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        if not checkpoints or any(type(c) is not int or c < 1 for c in checkpoints):
            raise ValueError("checkpoints must be whole seconds after the accept, each at least 1")
        self._client = client
        self._checkpoints = sorted(set(checkpoints))
        self._clock = clock
        self._accepts: list[_Accept] = []
        self._lock = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="strop-persistence", daemon=True)
            self._thread.start()

    def track(
        self,
        *,
        read: Callable[[], Reading],
        interaction_id: str | None = None,
        client_id: str | None = None,
        accepted_text: str | None = None,
        accepted_chars: int | None = None,
    ) -> None:
        """Record an accept now. Name the completion by ``interaction_id`` (Strop's) or ``client_id``
        (yours); ``accepted_text`` (optional) finds the completion in a document too long to send
        whole; ``accepted_chars`` for a partial accept (the leading characters taken)."""
        if (interaction_id is None) == (client_id is None):
            raise ValueError("name exactly one of interaction_id or client_id")
        name = {"interaction_id": str(interaction_id)} if interaction_id is not None else {"client_id": str(client_id)}
        accept = _Accept(self._clock(), read, name, accepted_text, accepted_chars, list(self._checkpoints))
        with self._lock:
            self._accepts.append(accept)
            del self._accepts[:-MAX_TRACKED]
            self._lock.notify()

    @property
    def tracked(self) -> int:
        """Accepts with a checkpoint still to report."""
        with self._lock:
            return len(self._accepts)

    def report_due(self) -> int:
        """Read and report every checkpoint due by the clock now; how many reports were sent."""
        now = self._clock()
        due: list[tuple[_Accept, int]] = []
        with self._lock:
            for accept in self._accepts:
                while accept.due and accept.accepted_at + accept.due[0] <= now:
                    due.append((accept, accept.due.pop(0)))
            self._accepts = [a for a in self._accepts if a.due]
        items = [item for accept, checkpoint in due if (item := self._item(accept, checkpoint)) is not None]
        if not items:
            return 0
        try:
            self._client.feedback.persistence_batch(items)
        except APIError as exc:
            log.warning("strop: %d persistence reports not sent: %s", len(items), exc)
            return 0
        return len(items)

    def _item(self, accept: _Accept, checkpoint: int) -> dict[str, Any] | None:
        try:
            reading = accept.read()
        except Exception:  # the plugin's reader failed: skip this checkpoint, keep the others
            log.warning("strop: reading the text for a persistence report failed", exc_info=True)
            return None
        if reading is None:
            return None
        item: dict[str, Any] = {**accept.name, "checkpoint_s": checkpoint, "occurred_at": datetime.now(UTC).isoformat()}
        if isinstance(reading, str):
            item["text"] = window(reading, accept.accepted_text)
        else:
            item["retained_ratio"] = min(1.0, max(0.0, float(reading)))
        if accept.accepted_chars is not None:
            item["accepted_chars"] = accept.accepted_chars
        return item

    def _next_due(self) -> float | None:
        return min((a.accepted_at + a.due[0] for a in self._accepts if a.due), default=None)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed:
                    next_due = self._next_due()
                    if next_due is not None and next_due <= self._clock():
                        break
                    # Wake at the next checkpoint (at least once a second, so an injected clock that
                    # jumps is noticed), or when a new accept comes.
                    self._lock.wait(timeout=1.0 if next_due is None else min(1.0, next_due - self._clock()))
                if self._closed:
                    return
            self.report_due()

    def close(self) -> None:
        """Stop the thread; checkpoints not yet due are not reported."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> PersistenceTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
