"""The checks of one field of a JSON item, each raising :class:`ItemError` that names the field: text,
ids, booleans, token ids and log-probabilities, bounded numbers, timestamps, metadata, unknown
fields. Hand-written and fast: the ingest endpoints run them on batches of up to
``STROP_MAX_BATCH_ITEMS`` items, where a DRF serializer per item would cost more than the insert."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from apps.common.parsing import end_user_id_problem, json_problem

MAX_ID_LEN = 200


MAX_TOKEN_ID = 2**31 - 1


MAX_LOGPROB = 1e-4  # logprobs are <= 0; allow float noise


# Numbers outside these ranges are a client's bug, not data: refused with a 400 rather than stored
# (where they would skew latency percentiles, importance weights or training windows).
MIN_LOGPROB = -10_000.0  # below any real token's log-probability; vLLM writes -9999.0 for -inf


EARLIEST_TIMESTAMP = datetime(2000, 1, 1, tzinfo=UTC)


MAX_CLOCK_SKEW = timedelta(days=1)  # a client's clock may run ahead of ours, not by more


class ItemError(Exception):
    def __init__(self, field_name: str, message: str, code: str = "invalid") -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = f"{field_name}: {message}"
        self.code = code

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "field": self.field}


def item_text(item: dict[str, Any], name: str, *, required: bool = False, max_len: int | None = None) -> str | None:
    value = item.get(name)
    if value is None:
        if required:
            raise ItemError(name, "is required", "required")
        return None
    if not isinstance(value, str):
        raise ItemError(name, f"must be a string, not {type(value).__name__}")
    if max_len is not None and len(value) > max_len:
        raise ItemError(name, f"is longer than {max_len} characters")
    if "\x00" in value:
        raise ItemError(name, "contains a NUL character, which cannot be stored")
    return value


def item_id(item: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = item_text(item, name, required=required, max_len=MAX_ID_LEN)
    if value is not None and not value.strip():
        raise ItemError(name, "must not be blank")
    return value


def item_end_user_id(item: dict[str, Any], name: str = "end_user_id") -> str:
    """The end user: absent or "" is nobody; anything else must be an id the API can address."""
    value = item.get(name)
    if value is None or value == "":
        return ""
    problem = end_user_id_problem(value)
    if problem is not None:
        raise ItemError(name, problem)
    return value


def item_bool(item: dict[str, Any], name: str) -> bool | None:
    value = item.get(name)
    if value is not None and not isinstance(value, bool):
        raise ItemError(name, f"must be true or false, not {type(value).__name__}")
    return value


_INT, _FLOAT = frozenset({int}), frozenset({float})


# Token-id fields an empty list cannot fill, with what to send instead. (An empty completion is data:
# ``completion_token_ids: []`` is the "stay silent" action, the model's EOS first.)
_EMPTY_IDS_REFUSED = {
    "prompt_token_ids": (
        "is empty; a prompt has at least one token: send the prompt's token ids, or leave the field out "
        "and Strop tokenizes the prompt's text"
    ),
}


def item_token_ids(item: dict[str, Any], name: str) -> list[int] | None:
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise ItemError(name, "must be a list of token ids")
    if not value and name in _EMPTY_IDS_REFUSED:
        raise ItemError(name, _EMPTY_IDS_REFUSED[name])
    if not value or (_INT.issuperset(map(type, value)) and min(value) >= 0 and max(value) <= MAX_TOKEN_ID):
        return value  # the common case, checked without a Python-level loop (bool is not int here)
    for index, token in enumerate(value):
        if type(token) is not int or token < 0 or token > MAX_TOKEN_ID:
            raise ItemError(name, f"item {index} must be a token id (an integer from 0 to {MAX_TOKEN_ID})")
    return value


def item_logprobs(item: dict[str, Any], name: str) -> list[float] | None:
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise ItemError(name, "must be a list of numbers")
    if not value or (
        _FLOAT.issuperset(map(type, value))
        and math.isfinite(sum(value))
        and max(value) <= MAX_LOGPROB
        and min(value) >= MIN_LOGPROB
    ):
        return value  # the common case; the JSON parser already refused NaN and Infinity
    out: list[float] = []
    for index, number in enumerate(value):
        if type(number) not in (int, float) or not math.isfinite(number):
            raise ItemError(name, f"item {index} must be a finite number")
        if number > MAX_LOGPROB:
            raise ItemError(name, f"item {index} is {number}; a log-probability is at most 0")
        if number < MIN_LOGPROB:
            lowest = plain_number(MIN_LOGPROB)
            raise ItemError(name, f"item {index} is {number}; a log-probability must be from {lowest} to 0")
        out.append(float(number))
    return out


def plain_number(number: float) -> str:
    return str(int(number)) if float(number).is_integer() and abs(number) < 1e15 else repr(number)


def item_number(
    item: dict[str, Any], name: str, *, minimum: float = 0.0, maximum: float, unit: str = ""
) -> float | None:
    value = item.get(name)
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ItemError(name, "must be a finite number")
    if not minimum <= value <= maximum:
        bounds = f"from {plain_number(minimum)} to {plain_number(maximum)}{unit}"
        raise ItemError(name, f"must be {bounds}, not {plain_number(value)}")
    return float(value)


def item_datetime(item: dict[str, Any], name: str) -> datetime | None:
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ItemError(name, "must be an ISO 8601 date-time string such as 2026-11-21T10:00:00Z")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ItemError(name, f"{value!r} is not an ISO 8601 date-time") from None
    if parsed.tzinfo is None:
        raise ItemError(name, "must include a timezone (for example a trailing Z for UTC)")
    try:  # 0001-01-01T00:00+01:00 parses, but is before year 1 in UTC
        parsed = parsed.astimezone(UTC)
    except OverflowError:
        raise ItemError(name, f"{value!r} is outside the years 1 to 9999 once converted to UTC") from None
    latest = datetime.now(UTC) + MAX_CLOCK_SKEW
    if not EARLIEST_TIMESTAMP <= parsed <= latest:
        raise ItemError(
            name,
            f"{value!r} is not a plausible time: it must be from {EARLIEST_TIMESTAMP:%Y-%m-%dT%H:%M:%SZ} to a day "
            f"from now ({latest:%Y-%m-%dT%H:%M:%SZ})",
        )
    return parsed


def item_metadata(item: dict[str, Any], name: str = "metadata") -> dict[str, Any]:
    value = item.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ItemError(name, "must be a JSON object")
    problem = json_problem(value, name)
    if problem is not None:
        raise ItemError(*problem)
    return value


def reject_unknown_fields(item: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = item.keys() - allowed
    if unknown:
        name = sorted(unknown)[0]
        raise ItemError(name, f"is not a known field (known: {', '.join(sorted(allowed))})", "unknown_field")
