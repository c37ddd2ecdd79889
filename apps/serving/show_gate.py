"""The show gate at serving time: a version's threshold on the model's own confidence decides,
per choice, whether the suggestion is shown or withheld (``learning_shared.show_filter`` fits it)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from apps.engines.vllm_client import Completion, CompletionChoice
from apps.interactions.served import model_text_storable
from apps.serving.services import Route
from learning_shared.show_filter import suggestion_score, threshold_of, withholds


def show_gate_of(route: Route) -> dict[str, Any] | None:
    """The serving version's show gate, if it has one."""
    gate = route.version.show_gate if route.version is not None else None
    return gate if threshold_of(gate) is not None else None


def withheld_choice(choice: CompletionChoice) -> CompletionChoice:
    """What the client gets of a withheld suggestion: nothing."""
    return replace(
        choice,
        text="",
        token_ids=[],
        logprobs=[],
        finish_reason="stop",
        stop_reason=None,
        tokens=[],
        text_offset=[],
        top_logprobs=[],
    )


def show_gate_decisions(completion: Completion, gate: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Each choice's gate decision, by choice index (none for a choice the model left empty itself)."""
    threshold, explore = threshold_of(gate), float(gate.get("explore") or 0.0)
    decisions = {}
    for choice in completion.choices:
        if not choice.text.strip():  # the model said nothing itself: nothing for the gate to judge
            continue
        score = suggestion_score(choice.logprobs)
        decision: dict[str, Any] = {"score": round(score, 4), "threshold": threshold, "withheld": False}
        if withholds(score, threshold):
            if explore > 0 and random.random() < explore:  # shown anyway, so the next fit sees below its threshold
                decision.update(explored=True, weight=round(1.0 / explore, 4))
            else:
                decision.update(withheld=True, text=model_text_storable(choice.text))  # kept in jsonb
        decisions[choice.index] = decision
    return decisions
