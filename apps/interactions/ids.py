"""Interaction ids: version 7 UUIDs (RFC 9562) made from when the interaction was served.

The first 48 bits are the served moment's Unix milliseconds, the other 74 random, so ids sort by
served time: each new row's key lands at the end of the primary key's index (a random id lands on
any of its pages, which at tens of millions of rows are mostly not in memory), and a range of ids
is a range of served time. Rows stored before keep their random (version 4) ids: nothing reads an
id's version or its bits. An editor key is not told the id of a row it did not make
(``apps.interactions.editor``), as the id says when that row was served.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from datetime import datetime

from django.utils import timezone

_VERSION_7 = bytes((b & 0x0F) | 0x70 for b in range(256))  # byte 6's high nibble: version 7
_VARIANT = bytes((b & 0x3F) | 0x80 for b in range(256))  # byte 8's top bits: the RFC 9562 variant


def _raw(moments: Sequence[datetime]) -> bytearray:
    """16 bytes an id, one per moment, the random bytes drawn at once. A moment before 1970 is taken
    as 1970."""
    raw = bytearray(os.urandom(16 * len(moments)))
    for i, moment in enumerate(moments):
        millis = max(int(moment.timestamp() * 1000), 0)  # 48 bits hold years past any datetime's 9999
        raw[16 * i : 16 * i + 6] = millis.to_bytes(6, "big")
    raw[6::16] = raw[6::16].translate(_VERSION_7)
    raw[8::16] = raw[8::16].translate(_VARIANT)
    return raw


def time_ids(moments: Sequence[datetime]) -> list[str]:
    """A new id for each of ``moments``, as text (as ``str(uuid.UUID)`` writes it)."""
    h = _raw(moments).hex()
    return [f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-{h[i + 12 : i + 16]}-{h[i + 16 : i + 20]}-{h[i + 20 : i + 32]}"
            for i in range(0, 32 * len(moments), 32)]  # fmt: skip


def time_id(moment: datetime | None = None) -> uuid.UUID:
    """One id made from ``moment`` (now, if not given), as a UUID (no text made and parsed back)."""
    return uuid.UUID(bytes=bytes(_raw([moment or timezone.now()])))
