"""A persistence tracker for editor plugins: after an accept, read what is at the insertion point at
30 s, 2 min and 10 min and report it, so Strop can measure how much of the completion the developer
kept (retained characters).

Nothing here runs on the caller's thread but ``track``, which only records the accept: a daemon
thread wakes when the next checkpoint is due, calls the plugin's reader, and sends every report due
(in as few batches as the API's limits allow). The clock is injectable, and ``background=False``
leaves the timing to the caller (``report_due``), for tests and for plugins that have a timer of their
own. A reader that fails or a send that fails is logged (logger ``strop.persistence``) and costs that
report only: nothing raises into the editor, and the thread carries on."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Union

from strop._batch_core import MAX_BATCH_ITEMS
from strop._exceptions import APIError

if TYPE_CHECKING:
    from strop._client import Strop

log = logging.getLogger("strop.persistence")

DEFAULT_CHECKPOINTS = (30, 120, 600)  # seconds after the accept
MAX_TEXT = 20_000  # what the API takes; a longer document is cut to a window around the completion
MAX_BATCH_TEXT = 2_000_000  # characters of text the API takes in one batch of reports (beyond: a 413)
MAX_TRACKED = 1_000  # accepts tracked at once; the oldest is dropped beyond it
# The API measures an accepted text by its first 2,000 characters: the window is centred on those.
MEASURED = 2_000
# Looking for the completion in a long document: its first characters, then (an edit at its start,
# a renamed function, is common) a few pieces of it spread over its length.
HEAD = 64
PIECE = 32
PIECES = 6

# What the reader returns: the text at the insertion point (or the document), or a share (0 to 1)
# the plugin measured itself; None when the document is gone (closed unsaved: nothing is reported).
Reading = Union[str, float, None]


@dataclass
class _Accept:
    accepted_at: float
    read: Callable[[], Reading]
    name: dict[str, str]
    accepted_text: str | None
    accepted_chars: int | None
    insertion_offset: int | None = None
    due: list[int] = field(default_factory=list)


def window(
    text: str,
    accepted_text: str | None,
    limit: int = MAX_TEXT,
    *,
    insertion_offset: int | None = None,
) -> str:
    """``text`` cut to ``limit`` characters around the completion, so a long document still carries
    it. The completion is where ``accepted_text`` is found (its start, or else a piece of it; the
    occurrence nearest ``insertion_offset`` when there is one), else at ``insertion_offset``, else it
    is not known and the document's start is sent."""
    if len(text) <= limit:
        return text
    start = completion_start(text, accepted_text, insertion_offset)
    if start is None:
        return text[:limit]
    measured = min(len(accepted_text or ""), MEASURED)
    first = max(0, min(start - (limit - measured) // 2, len(text) - limit))
    return text[first : first + limit]


def completion_start(text: str, accepted_text: str | None, insertion_offset: int | None) -> int | None:
    """Where the completion starts in ``text`` now, as well as can be told (None: not at all). Without
    an offset, where its first piece found puts it; with one, the start any piece puts nearest it
    (code is copied: another copy may still hold a piece the developer edited here)."""
    if insertion_offset is None:
        for at, piece in _probes(accepted_text or ""):
            found = text.find(piece)
            if found >= 0:
                return max(0, found - at)
        return None
    starts = [
        max(0, found - at)
        for at, piece in _probes(accepted_text or "")
        if (found := _nearest(text, piece, insertion_offset + at)) >= 0
    ]
    return min(starts, key=lambda start: abs(start - insertion_offset), default=min(insertion_offset, len(text)))


def _probes(accepted_text: str) -> Iterator[tuple[int, str]]:
    """(position in ``accepted_text``, the piece there) to look for, its start first. Blank pieces
    are left out: indentation matches anywhere."""
    if accepted_text[:HEAD].strip():
        yield 0, accepted_text[:HEAD]
    last = len(accepted_text) - PIECE
    for at in sorted({last * k // PIECES for k in range(1, PIECES + 1)} if last > 0 else set()):
        piece = accepted_text[at : at + PIECE]
        if piece.strip():
            yield at, piece


def _nearest(text: str, piece: str, expected: int) -> int:
    """Where ``piece`` occurs in ``text`` nearest ``expected``; -1: nowhere."""
    expected = min(max(0, expected), len(text))
    after = text.find(piece, expected)
    before = text.rfind(piece, 0, expected + len(piece) - 1)
    if before < 0 or (after >= 0 and after - expected < expected - before):
        return after
    return before


class PersistenceTracker:
    """Reports what is left of accepted completions at checkpoints after each accept.

    ``tracker.track(interaction_id=..., read=lambda: buffer_text(), insertion_offset=...)`` when the
    developer accepts; the tracker calls ``read`` at each checkpoint (from its own thread: ``read`` must
    be safe to call there, and quick) and sends the reports through ``client``. A reader that fails or
    a send that fails is logged and that report dropped: a later checkpoint still reports."""

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
        insertion_offset: int | None = None,
    ) -> None:
        """Record an accept now. Name the completion by ``interaction_id`` (Strop's) or ``client_id``
        (yours); ``accepted_chars`` for a partial accept (the leading characters taken). When ``read``
        returns a document too long to send whole, a window of it around the completion is sent: give
        ``insertion_offset`` (the character offset in the document where the completion was inserted)
        and ``accepted_text`` to find it there. ``RuntimeError`` after :meth:`close`."""
        if (interaction_id is None) == (client_id is None):
            raise ValueError("name exactly one of interaction_id or client_id")
        if insertion_offset is not None and (type(insertion_offset) is not int or insertion_offset < 0):
            raise ValueError("insertion_offset must be a character offset in the document (0 or more)")
        name = {"interaction_id": str(interaction_id)} if interaction_id is not None else {"client_id": str(client_id)}
        if accepted_text is not None and accepted_chars is not None:
            accepted_text = accepted_text[:accepted_chars]  # what was inserted is all that can be found
        accept = _Accept(
            self._clock(), read, name, accepted_text, accepted_chars, insertion_offset, list(self._checkpoints)
        )
        with self._lock:
            if self._closed:
                raise RuntimeError("the persistence tracker is closed")
            self._accepts.append(accept)
            del self._accepts[:-MAX_TRACKED]
            self._lock.notify()

    @property
    def tracked(self) -> int:
        """Accepts with a checkpoint still to report."""
        with self._lock:
            return len(self._accepts)

    def report_due(self) -> int:
        """Read and report every checkpoint due by the clock now; how many reports were sent. A batch
        holds what the API takes (``MAX_BATCH_ITEMS`` reports, ``MAX_BATCH_TEXT`` characters of text):
        more is sent in several."""
        now = self._clock()
        due: list[tuple[_Accept, int]] = []
        with self._lock:
            for accept in self._accepts:
                while accept.due and accept.accepted_at + accept.due[0] <= now:
                    due.append((accept, accept.due.pop(0)))
            self._accepts = [a for a in self._accepts if a.due]
        sent = 0
        batch: list[dict[str, Any]] = []
        batch_text = 0
        for accept, checkpoint in due:
            item = self._item(accept, checkpoint)
            if item is None:
                continue
            text = len(item.get("text", ""))
            if batch and (len(batch) == MAX_BATCH_ITEMS or batch_text + text > MAX_BATCH_TEXT):
                sent += self._send(batch)
                batch, batch_text = [], 0
            batch.append(item)
            batch_text += text
        if batch:
            sent += self._send(batch)
        return sent

    def _send(self, items: list[dict[str, Any]]) -> int:
        try:
            result = self._client.feedback.persistence_batch(items)
        except APIError as exc:
            log.warning("strop: %d persistence reports not sent: %s", len(items), exc)
            return 0
        except Exception:  # a closed client, a bug: logged, never raised into the editor or the thread
            log.exception("strop: %d persistence reports not sent", len(items))
            return 0
        rejected = result.rejected
        if rejected:
            log.warning("strop: %d persistence reports rejected: %s", len(rejected), rejected[0].error)
        return len(items)

    def _item(self, accept: _Accept, checkpoint: int) -> dict[str, Any] | None:
        try:
            reading = accept.read()
            if reading is None:
                return None
            measured = self._measured(accept, reading)
        except Exception:  # the plugin's reader failed: skip this checkpoint, keep the others
            log.warning("strop: no persistence report at %d s: reading the text failed", checkpoint, exc_info=True)
            return None
        item: dict[str, Any] = {
            **accept.name,
            "checkpoint_s": checkpoint,
            "occurred_at": datetime.now(timezone.utc).isoformat(),
            **measured,
        }
        if accept.accepted_chars is not None:
            item["accepted_chars"] = accept.accepted_chars
        return item

    @staticmethod
    def _measured(accept: _Accept, reading: str | float) -> dict[str, Any]:
        """The report's ``text`` or ``retained_ratio``; TypeError or ValueError for any other reading."""
        if isinstance(reading, str):
            return {"text": window(reading, accept.accepted_text, insertion_offset=accept.insertion_offset)}
        if isinstance(reading, (bytes, bytearray, memoryview)):  # float() would take b"0.5": text, not a share
            raise TypeError("the reader returned bytes: return the text as str")
        ratio = float(reading)
        if not math.isfinite(ratio):
            raise ValueError(f"the reader returned {ratio}: a share must be from 0 to 1")
        return {"retained_ratio": min(1.0, max(0.0, ratio))}

    def _next_due(self) -> float | None:
        return min((a.accepted_at + a.due[0] for a in self._accepts if a.due), default=None)

    def _wait_for_due(self) -> bool:
        """Wait until a checkpoint is due (True) or the tracker is closed (False)."""
        with self._lock:
            while not self._closed:
                next_due = self._next_due()
                if next_due is not None and next_due <= self._clock():
                    return True
                # Wake at the next checkpoint (at least once a second, so an injected clock that
                # jumps is noticed), or when a new accept comes.
                self._lock.wait(timeout=1.0 if next_due is None else min(1.0, next_due - self._clock()))
            return False

    def _run(self) -> None:
        while True:
            try:
                if not self._wait_for_due():
                    return
                self.report_due()
            except Exception:  # the thread must live on: a dead one would leave later accepts unreported
                log.exception("strop: reporting persistence failed; the tracker carries on")
                with self._lock:
                    if not self._closed:
                        self._lock.wait(timeout=1.0)  # a clock that keeps failing must not spin

    def close(self) -> None:
        """Stop the thread; checkpoints not yet due are not reported, and ``track`` raises after it."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> PersistenceTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
