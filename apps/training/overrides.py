"""What a tenant may change of the trainer and the eval gate, and within which bounds.

A tenant's ``trainer_overrides`` and ``gate_overrides`` tune learning, never the machine: every
key is on an allow-list with a range, and what decides the cost of a run or where it runs
(device, dtype, token budgets, the maximum LoRA rank, the wall-time limit) stays the operator's,
set in the environment. The same check runs when a policy is saved and when a run starts, so a
policy stored before a limit was tightened fails its run with the same clear message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps.common.exceptions import ValidationFailed


@dataclass(frozen=True)
class Knob:
    """One tenant-settable field: a number in [low, high], a bool, or one of ``choices``."""

    kind: type
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False

    def describe(self) -> str:
        if self.kind is bool:
            return "true or false"
        if self.choices:
            return " or ".join(repr(c) for c in self.choices)
        text = f"{'an integer' if self.kind is int else 'a number'} from {self.low:g} to {self.high:g}"
        return f"{text}, or null" if self.nullable else text

    def check(self, name: str, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        if self.kind is bool:
            ok = isinstance(value, bool)
        elif self.choices:
            ok = isinstance(value, str) and value in self.choices
        else:
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            # No float() of an int: one past a double's range (JSON has no limit) is an OverflowError.
            ok = number and (self.kind is float or isinstance(value, int) or value.is_integer())
            if ok and self.low is not None and self.high is not None:
                ok = self.low <= value <= self.high  # False for NaN; exact for any int
            if ok:
                value = float(value) if self.kind is float else int(value)
        if not ok:
            raise ValidationFailed(f"{name}: must be {self.describe()}, not {_shown(value)}")
        return value


def _shown(value: Any, *, limit: int = 80) -> str:
    """``value`` as a message may quote it: short, and never an error of its own. ``repr`` refuses an
    integer of more than 4,300 digits and recurses on deep nesting; a lone surrogate, which no page
    can encode, is written as its escape."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__} too large to show"
    text = text.encode("utf-8", "backslashreplace").decode()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def trainer_knobs() -> dict[str, Knob]:
    """PPOConfig fields a tenant may set. ``lora_rank`` is bounded by the rank vLLM serves."""
    return {
        "learning_rate": Knob(float, 1e-6, 1e-2),
        "epochs": Knob(int, 1, 4),
        "num_minibatches": Knob(int, 1, 16),
        "clip_eps": Knob(float, 0.01, 0.5),
        "kl_coef": Knob(float, 0.0, 1.0),
        "target_kl": Knob(float, 0.001, 1.0, nullable=True),
        "baseline": Knob(str, choices=("batch_mean", "none")),
        "normalize_advantages": Knob(bool),
        "loss_aggregation": Knob(str, choices=("token_mean", "sequence_mean")),
        "silence_counterfactual": Knob(bool),
        "silence_gated": Knob(bool),
        "silence_clip": Knob(float, 0.01, 1.0),
        "preference_coef": Knob(float, 0.0, 10.0),
        "preference_beta": Knob(float, 0.01, 10.0),
        "importance_correction": Knob(bool),
        "importance_cap": Knob(float, 1.0, 10.0),
        "max_grad_norm": Knob(float, 0.01, 10.0),
        "weight_decay": Knob(float, 0.0, 0.1),
        "lora_rank": Knob(int, 1, settings.VLLM_MAX_LORA_RANK),
        "lora_alpha": Knob(float, 1.0, 256.0),
        "lora_dropout": Knob(float, 0.0, 0.5),
        # Shorter prompts only: the default (1024) is the most a run's passes are sized for.
        "max_prompt_tokens": Knob(int, 16, 1024),
    }


def gate_knobs() -> dict[str, Knob]:
    """GateConfig fields a tenant may set (how strict the gate is, not how much it computes)."""
    return {
        "max_kl": Knob(float, 0.01, 5.0),
        "reward_margin": Knob(float, 0.0, 20.0),
        "importance_cap": Knob(float, 1.0, 20.0),
        "min_heldout": Knob(int, 1, 1000),
        "fim_margin": Knob(float, 0.0, 1.0),
        "feedback_direction_z": Knob(float, 0.0, 20.0),
        "max_fim_samples": Knob(int, 1, 64),
        "max_new_tokens": Knob(int, 1, 64),
    }


def overrides_checked(field: str, overrides: Any) -> dict[str, Any]:
    """``overrides`` with every key allowed and in range, or ValidationFailed naming the key and its range."""
    knobs = trainer_knobs() if field == "trainer_overrides" else gate_knobs()
    if not isinstance(overrides, dict):
        raise ValidationFailed(f"{field}: must be a JSON object")
    checked: dict[str, Any] = {}
    for name, value in overrides.items():
        knob = knobs.get(name)
        if knob is None:
            raise ValidationFailed(
                f"{field}.{_key(name)}: not a setting a tenant may change (allowed: {', '.join(knobs)})",
                code="unknown_field",
            )
        checked[name] = knob.check(f"{field}.{name}", value)
    return checked


def _key(name: str) -> str:
    """A key the message repeats: as typed when it is a short printable name, else quoted safely."""
    return name if name.isprintable() and len(name) <= 80 else _shown(name)


def overrides_reference() -> dict[str, dict[str, str]]:
    """Every allowed key and its range, as the API and the dashboard describe them."""
    return {
        "trainer_overrides": {name: knob.describe() for name, knob in trainer_knobs().items()},
        "gate_overrides": {name: knob.describe() for name, knob in gate_knobs().items()},
    }
