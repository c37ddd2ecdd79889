"""What an open stream's part takes of a choice (apps.serving.chat_choice.ChoiceSoFar.since,
apps.serving.completions._pieces_since): only what came since the last write, and copies the stream
no longer touches."""

from __future__ import annotations

from apps.engines.vllm_types import CompletionChoice, CompletionChunk
from apps.serving.chat_choice import ChoiceSoFar
from apps.serving.completions import _pieces_since


def _delta(
    content: str, token: int, *, tool_args: str | None = None, first_of_call: bool = True, finish: str | None = None
) -> dict:
    delta: dict = {"content": content}
    if tool_args is not None:  # a call's id and name come with its first delta only, as OpenAI's
        call = {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": tool_args}}
        delta["tool_calls"] = [call if first_of_call else {"index": 0, "function": {"arguments": tool_args}}]
    return {
        "delta": delta,
        "token_ids": [token],
        "logprobs": {"content": [{"logprob": -0.5}]},
        "finish_reason": finish,
    }


def test_a_part_holds_only_what_came_since_the_last_write():
    choice = ChoiceSoFar()
    choice.add(_delta(" a", 1), message_key="delta")
    first, cursor = choice.since(None)
    assert (first.text, first.token_ids, first.logprobs, first.metadata) == (" a", [1], [-0.5], {})
    assert choice.since(cursor) is None  # nothing new: no part
    choice.add(_delta(" b", 2), message_key="delta")
    choice.add(_delta(" c", 3, finish="length"), message_key="delta")
    second, _ = choice.since(cursor)
    assert (second.text, second.token_ids, second.metadata) == (" b c", [2, 3], {"finish_reason": "length"})


def test_a_parts_tool_calls_hold_only_the_arguments_new_since_the_last_write():
    choice = ChoiceSoFar()
    choice.add(_delta("", 1, tool_args='{"x": '), message_key="delta")
    first, cursor = choice.since(None)
    choice.add(_delta("", 2, tool_args="1}", first_of_call=False), message_key="delta")
    second, cursor = choice.since(cursor)
    assert first.metadata["tool_calls_since"] == [{"index": 0, "id": "call_1", "name": "f", "arguments": '{"x": '}]
    assert second.metadata["tool_calls_since"] == [{"index": 0, "arguments": "1}"}]  # no copy of the first
    assert choice.since(cursor) is None
    assert choice.tool_calls[0]["function"]["arguments"] == '{"x": 1}'


def _chunk(*choices: tuple[int, str, str | None]) -> CompletionChunk:
    return CompletionChunk(
        "cmpl", "tab", [CompletionChoice(i, text, [1], [-0.5], finish, None) for i, text, finish in choices], None,
        None, "r",
    )  # fmt: skip


def test_a_completion_choice_that_finished_is_not_read_again_while_the_others_go_on():
    seen = [_chunk((0, " a", None), (1, " x", "stop"))]
    cursors: dict[int, int] = {}
    for index, piece, cursor in _pieces_since(seen, 2, cursors):
        assert (index, piece.text) in {(0, " a"), (1, " x")}
        cursors[index] = cursor  # written
    seen += [_chunk((0, " b", None)), _chunk((0, " c", "length"))]
    ((index, piece, cursor),) = _pieces_since(seen, 2, cursors)
    assert (index, piece.text, piece.metadata) == (0, " b c", {"finish_reason": "length"})
    assert cursors[1] == len(seen)  # choice 1 has nothing new: the next write starts where this one ended
