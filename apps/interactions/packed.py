"""An interaction's token ids and behaviour log-probabilities, stored packed rather than as JSON.

A prompt of 300 token ids takes about 4.5 KB as ``jsonb`` (each id a ``numeric``; Postgres
compresses it to about 1.6 KB out of line) and 601 bytes packed; the ids are the bulk of a served
interaction's row. Ids are written two bytes each when every id of the list is under 65,536 (as
in a vocabulary of up to 64K tokens, SmolLM2's 49,152) and four bytes otherwise, after one byte
that says which (2 or 4). Log-probabilities are 8-byte floats: what is stored is what was
sent, to the bit (the trainer's importance ratio reads them). Both in network byte order, the
order Postgres' ``int4send`` and ``float8send`` write, so the migration that packed the stored
rows did it in SQL.

The model fields take and give lists, as the JSON fields did; the raw writers (``COPY``, the
plain ``INSERT`` of a served completion) pack with :func:`pack_ids` and :func:`pack_floats`.
An empty list is an empty value, ``None`` is ``NULL``."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

import orjson
from django.db import models

_SWAP = sys.byteorder == "little"
_WIDTHS = {2: "H", 4: "i"}  # the ids' leading byte: bytes an id, and the array type that reads them
assert array("H").itemsize == 2 and array("i").itemsize == 4 and array("d").itemsize == 8


def _to_bytes(values: array) -> bytes:  # type: ignore[type-arg]
    if _SWAP:
        values.byteswap()
    return values.tobytes()


def _from_bytes(code: str, raw: bytes | bytearray | memoryview) -> list[Any]:
    values = array(code)
    values.frombytes(raw)
    if _SWAP:
        values.byteswap()
    return values.tolist()


def pack_ids(values: Sequence[int] | None) -> bytes | None:
    """Token ids (0 to 2**31 - 1, as validation allows): 2 bytes each when all are under 65,536,
    else 4, after the byte that says which."""
    if values is None:
        return None
    if not values:
        return b""
    width = 2 if max(values) < 65_536 else 4
    return bytes((width,)) + _to_bytes(array(_WIDTHS[width], values))


def _json_written(raw: bytes | bytearray | memoryview | str) -> bool:
    """Whether the value is JSON text an old process (one still running while an upgrade migrated)
    wrote into the binary column (SQLite gives it back as text). Its first byte, "[", is no width
    and no logprob's first byte (a float that starts 0x5B is over 1e130)."""
    return isinstance(raw, str) or raw[:1] == b"["


def unpack_ids(raw: bytes | bytearray | memoryview | str | None) -> list[int] | None:
    if raw is None:
        return None
    if isinstance(raw, str) or _json_written(raw):
        return orjson.loads(raw if isinstance(raw, str) else bytes(raw))  # type: ignore[no-any-return]
    if not raw:
        return []
    code = _WIDTHS.get(raw[0])
    if code is None:
        raise ValueError(f"packed token ids start with {raw[0]}, not a width (2 or 4)")
    return _from_bytes(code, raw[1:])


def pack_floats(values: Sequence[float] | None) -> bytes | None:
    """Log-probabilities as 8-byte big-endian floats (exact, ``-inf`` included). A list with a
    ``None`` in it (JSON wrote a ``-inf`` as ``null``) raises ``TypeError``: callers that can meet
    one store no logprobs instead (the trainer then treats the tokens as on-policy)."""
    return None if values is None else _to_bytes(array("d", values))


def unpack_floats(raw: bytes | bytearray | memoryview | str | None) -> list[float] | None:
    if raw is None:
        return None
    if isinstance(raw, str) or _json_written(raw):
        return orjson.loads(raw if isinstance(raw, str) else bytes(raw))  # type: ignore[no-any-return]
    return _from_bytes("d", raw)


class _PackedListField(models.BinaryField):
    """A list of numbers in a binary column: lists in and out of the ORM, bytes in the database.
    Serialized (``dumpdata``) as a string of JSON, which ``loaddata`` reads back."""

    # What django-stubs' plugin types the model attribute as (set and read).
    _pyi_private_set_type: Sequence[Any] | bytes | None  # type: ignore[assignment]
    _pyi_private_get_type: list[Any] | None  # type: ignore[assignment]

    @staticmethod
    def pack(values: Sequence[Any] | None) -> bytes | None:
        raise NotImplementedError

    @staticmethod
    def unpack(raw: bytes | bytearray | memoryview | str | None) -> list[Any] | None:
        raise NotImplementedError

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
            value = self.pack(value)
        return super().get_db_prep_value(value, connection, prepared)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> list[Any] | None:
        return self.unpack(value)

    def to_python(self, value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview, str)):  # a string: dumpdata's JSON
            return self.unpack(value)
        return value

    def value_to_string(self, obj: Any) -> str:
        return orjson.dumps(self.value_from_object(obj)).decode()


class PackedIdsField(_PackedListField):
    """Token ids, 2 or 4 bytes each (:func:`pack_ids`)."""

    _pyi_private_get_type: list[int] | None

    pack = staticmethod(pack_ids)
    unpack = staticmethod(unpack_ids)


class PackedFloatsField(_PackedListField):
    """Log-probabilities, 8 bytes each."""

    _pyi_private_get_type: list[float] | None

    pack = staticmethod(pack_floats)
    unpack = staticmethod(unpack_floats)
