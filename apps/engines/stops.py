"""Stop strings beyond the four vLLM takes, applied by Strop on the text vLLM generates.

vLLM refuses more than four ``stop`` strings; editor plugins send ten or more. Strop passes the
first four to vLLM and applies every one itself: the text is cut where the earliest stop string
starts, which is what vLLM would have done with the whole list (a stop vLLM did not see can only
cut earlier). The tokens kept are those up to and including the one the stop string starts in,
as vLLM keeps the token that holds a stop string: training learns on what was really generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

VLLM_MAX_STOP = 4


def earliest_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """(index, stop string) of the earliest stop in ``text``; the longer one on a tie."""
    found: tuple[int, str] | None = None
    for stop in stops:
        index = text.find(stop)
        if index >= 0 and (found is None or index < found[0] or (index == found[0] and len(stop) > len(found[1]))):
            found = (index, stop)
    return found


def tokens_through(text_offsets: Sequence[int], cut: int) -> int:
    """How many tokens to keep when the text is cut at character ``cut``: every token that starts
    at or before it (the last of them holds the stop string's first character)."""
    kept = 0
    for offset in text_offsets:
        if offset > cut:
            break
        kept += 1
    return max(kept, 1)


@dataclass
class StopScanner:
    """Applies stop strings to a stream of text pieces without ever sending part of a stop.

    ``feed`` returns the text that is safe to send now; text that could still be the start of a
    stop string is held back until the next piece shows whether it is. ``stopped`` is set with
    the stop string that matched; ``sent`` counts the characters released so far.
    """

    stops: Sequence[str]
    pending: str = ""
    sent: int = 0
    stopped: str | None = None

    def feed(self, piece: str) -> str:
        if self.stopped is not None:
            return ""
        self.pending += piece
        hit = earliest_stop(self.pending, self.stops)
        if hit is not None:
            index, self.stopped = hit
            out, self.pending = self.pending[:index], ""
        else:
            hold = self._held_back()
            out, self.pending = self.pending[: len(self.pending) - hold], self.pending[len(self.pending) - hold :]
        self.sent += len(out)
        return out

    def finish(self) -> str:
        """The text still held back once the stream ended without a stop."""
        out, self.pending = ("" if self.stopped is not None else self.pending), ""
        self.sent += len(out)
        return out

    def _held_back(self) -> int:
        """Length of the longest tail of ``pending`` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.pending)), longest, -1):
                if self.pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest
