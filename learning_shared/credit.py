"""Token-level credit: which served tokens a user kept, and the reward each one earns.

Pure functions (a tokenizer is passed in), shared by the exporter (``apps.training.dataset``) and
the learning benchmark, so both turn a partial accept, an edit or an agent's persisted edit into
the same per-token rewards, and an edit's kept text into the same preferred continuation.

A token's characters are where decoding the served tokens up to it ends, with the base model's
tokenizer: exactly the text those tokens produce. A token that holds part of a character decodes
to a replacement character of its own, so it counts as kept only when the whole character is.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

# The shortest run of characters an answer and the text that persisted must share for it to count:
# shorter runs (a bracket, a space and a letter) line up by chance between any two pieces of code.
MIN_PERSISTED_RUN = 3


def common_prefix_length(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def _decoded_prefixes(completion_token_ids: list[int], tokenizer: Any) -> list[str]:
    """The text of the first k + 1 served tokens, for each k."""
    return tokenizer.batch_decode(
        [completion_token_ids[: k + 1] for k in range(len(completion_token_ids))], skip_special_tokens=True
    )


def kept_prefix(outcome: str, completion: str, *, accepted_chars: int | None, kept_text: str) -> str | None:
    """The leading text of ``completion`` the user kept: a partial accept's first ``accepted_chars``
    characters, an edit's longest common prefix with ``kept_text``; None for the other outcomes
    (their one reward is the whole completion's)."""
    if outcome == "partial" and accepted_chars is not None:
        # A partial accept that arrived before its interaction could not be checked against it: one
        # covering the whole completion keeps all of it.
        return completion[:accepted_chars]
    if outcome == "edited":
        return completion[: common_prefix_length(completion, kept_text)]
    return None


def preferred_token_ids(outcome: str, completion: str, *, kept_text: str, tokenizer: Any) -> list[int] | None:
    """An edit's kept text as tokens, the continuation the user preferred to ``completion`` (the
    pairwise loss of ``gpu_trainer.preference``); None for the other outcomes, an empty kept text,
    or one that is the completion itself (trailing blanks aside)."""
    if outcome != "edited" or not kept_text.strip() or kept_text.rstrip() == completion.rstrip():
        return None
    return tokenizer.encode(kept_text, add_special_tokens=False) or None


def token_rewards(
    completion_token_ids: list[int], kept: str, *, tokenizer: Any, kept_reward: float, rejected_reward: float
) -> list[float]:
    """One reward per served token: ``kept_reward`` for each token entirely inside the kept text
    ``kept``, ``rejected_reward`` for the first that is not (the user saw it and did not take it),
    0 for the rest (they hang on a token the user refused: no credit either way)."""
    if not completion_token_ids:
        return []
    prefixes = _decoded_prefixes(completion_token_ids, tokenizer)
    kept_length = common_prefix_length(prefixes[-1], kept)
    first_untaken = next((k for k, text in enumerate(prefixes) if len(text) > kept_length), len(prefixes))
    return [
        kept_reward if k < first_untaken else rejected_reward if k == first_untaken else 0.0
        for k in range(len(prefixes))
    ]


def token_char_spans(completion_token_ids: list[int], *, tokenizer: Any) -> tuple[str, list[tuple[int, int]]]:
    """The served tokens' text and, per token, the characters ``[start, end)`` of that text it
    writes: from the first character the tokens before it left unfinished to the last one it
    touches. The tokens that write one character between them (the bytes of "€") all span it; a
    token that writes nothing (a special token) spans no character."""
    prefixes = _decoded_prefixes(completion_token_ids, tokenizer)
    text = prefixes[-1] if prefixes else ""
    spans: list[tuple[int, int]] = []
    finished = 0  # characters of ``text`` the tokens so far have written in full
    for prefix in prefixes:
        done = common_prefix_length(prefix, text)
        # A prefix longer than what it finished ends inside a character: the token touches it too.
        end = min(done + 1, len(text)) if len(prefix) > done else done
        spans.append((finished, end))
        finished = done
    return text, spans


def persisted_chars(text: str, kept_text: str, *, min_run: int = MIN_PERSISTED_RUN) -> list[bool]:
    """Per character of ``text``: whether it is one of the characters that persisted in
    ``kept_text``, as ``difflib.SequenceMatcher`` aligns the two (in order, each kept character
    matched at most once; no automatic junk, which would drop the characters common in code),
    counting only runs of at least ``min_run`` characters."""
    flags = [False] * len(text)
    matcher = SequenceMatcher(None, text, kept_text, autojunk=False)
    for block in matcher.get_matching_blocks():
        if block.size >= min_run:
            flags[block.a : block.a + block.size] = [True] * block.size
    return flags


def persisted_token_rewards(
    completion_token_ids: list[int], kept_text: str, *, tokenizer: Any, persisted_reward: float
) -> list[float] | None:
    """An answer whose edit persisted, credited token by token: ``persisted_reward`` for each
    served token whose characters all persisted in ``kept_text`` (``persisted_chars``), 0 for
    every other token; None when no token persisted (a ``kept_text`` that shares nothing with the
    answer says nothing about its tokens: the answer keeps its one scalar reward).

    The other tokens get 0, whether code that did not persist or prose around it: the signal is a
    positive one, it says what stayed and not that the rest was wrong (that is ``edit_reverted``),
    so nothing is penalised (0 is the reward of showing nothing: against the batch-mean baseline
    such a token moves as a not-shown event's would). Code and prose are not told apart (by fenced
    blocks, say): both would earn 0, and code an agent writes through a tool call's arguments is
    not fenced."""
    text, spans = token_char_spans(completion_token_ids, tokenizer=tokenizer)
    persisted = persisted_chars(text, kept_text)
    kept = [start < end and all(persisted[start:end]) for start, end in spans]
    if not any(kept):
        return None
    return [persisted_reward if k else 0.0 for k in kept]


# The outcomes that say which tokens the user kept; the others earn one reward for the whole completion.
CREDITED_OUTCOMES = frozenset({"partial", "edited", "edit_persisted"})


@dataclass(frozen=True)
class EventCredit:
    """What one event says token by token: ``token_rewards`` (one per served token) and, for an
    edit, ``preferred_token_ids`` (the kept text as tokens); either None where it says nothing."""

    token_rewards: list[float] | None = None
    preferred_token_ids: list[int] | None = None


def event_credit(
    outcome: str,
    completion: str,
    completion_token_ids: list[int],
    *,
    accepted_chars: int | None,
    kept_text: str | None,
    tokenizer: Any,
    kept_reward: float,
    rejected_reward: float,
    persisted_reward: float,
) -> EventCredit:
    """The token-level credit of one event, in one call: a partial accept's or an edit's kept
    prefix (``token_rewards``), an ``edit_persisted``'s persisted characters
    (``persisted_token_rewards``, when it sent ``kept_text``), an edit's preferred continuation
    (``preferred_token_ids``). Rewards come already scaled by the event's weight."""
    rewards = None
    if completion_token_ids and outcome in CREDITED_OUTCOMES:
        if outcome == "edit_persisted":
            if kept_text:
                rewards = persisted_token_rewards(
                    completion_token_ids, kept_text, tokenizer=tokenizer, persisted_reward=persisted_reward
                )
        else:
            kept = kept_prefix(outcome, completion, accepted_chars=accepted_chars, kept_text=kept_text or "")
            if kept is not None:
                rewards = token_rewards(
                    completion_token_ids,
                    kept,
                    tokenizer=tokenizer,
                    kept_reward=kept_reward,
                    rejected_reward=rejected_reward,
                )
    preferred = None
    if outcome == "edited" and kept_text:
        preferred = preferred_token_ids(outcome, completion, kept_text=kept_text, tokenizer=tokenizer)
    return EventCredit(token_rewards=rewards, preferred_token_ids=preferred)
