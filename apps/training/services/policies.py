"""The training policy a tenant admin edits, and the FIM eval set the gate checks candidates on."""


from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from apps.adapters.models import Adapter
from apps.common.exceptions import ValidationFailed
from apps.common.parsing import json_problem
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record
from apps.training.models import REWARD_FIELDS, EvalSet, TrainingPolicy
from apps.training.overrides import overrides_checked
from apps.training.selectors import training_policy_get

logger = logging.getLogger(__name__)


POLICY_FIELDS = {
    "enabled": bool,
    "min_new_events": int,
    "max_wait_s": int,
    "heldout_fraction": float,
    **dict.fromkeys(REWARD_FIELDS.values(), float),
    "auto_experiment": bool,
    "credit_retained": bool,
    "show_gate": bool,
    "show_gate_recall": float,
    "show_gate_explore": float,
    "trainer_overrides": dict,
    "gate_overrides": dict,
}


# Bounds of the numeric policy fields: what the database column holds and what a run can use.
POLICY_RANGES: dict[str, tuple[float, float]] = {
    "min_new_events": (1, 1_000_000),
    "max_wait_s": (0, 366 * 24 * 3600),
    **dict.fromkeys(REWARD_FIELDS.values(), (-10.0, 10.0)),
    "show_gate_recall": (0.5, 1.0),
    "show_gate_explore": (0.0, 1.0),
}


def training_policy_update(tenant: Tenant, *, adapter: Adapter, actor: str, changes: dict[str, Any]) -> TrainingPolicy:
    policy = training_policy_get(adapter)
    for name, value in changes.items():
        problem = json_problem(value, name)  # before anything walks it: overrides are free-form JSON
        if problem is not None:
            raise ValidationFailed(f"{problem[0]}: {problem[1]}")
        kind = POLICY_FIELDS.get(name)
        if kind is None:
            raise ValidationFailed(
                f"{name}: not a training policy field ({', '.join(POLICY_FIELDS)})", code="unknown_field"
            )
        if kind is float and type(value) is int:
            value = float(value)
        if type(value) is not kind:
            raise ValidationFailed(f"{name}: must be {kind.__name__}")
        setattr(policy, name, value)
    for name in ("trainer_overrides", "gate_overrides"):
        if name in changes:
            setattr(policy, name, overrides_checked(name, changes[name]))
    for name, (low, high) in POLICY_RANGES.items():
        value = getattr(policy, name)
        if not low <= value <= high:
            raise ValidationFailed(f"{name}: must be from {low} to {high}, not {value}")
    if not 0.0 <= policy.heldout_fraction < 0.9:
        raise ValidationFailed("heldout_fraction: must be in [0, 0.9)")
    with transaction.atomic():
        policy.save()
        audit_record(
            tenant,
            actor=actor,
            action="training_policy.update",
            target_type="adapter",
            target_id=adapter.name,
            data={k: v for k, v in changes.items()},
        )
    return policy


MAX_EVAL_CASES = 500
# A case's longest fields, in characters. The gate decodes at most 64 tokens of a middle and scores
# it by an edit distance whose cost is the product of the two lengths: a middle is a line or a block.
# The gate decodes a case's FIM prompt whole (only held-out and training prompts are cut to
# max_prompt_tokens), so these bounds are all that bound it.
MAX_EVAL_CHARS = {"prefix": 100_000, "suffix": 100_000, "middle": 4_000}


_EVAL_FIELDS = ("prefix", "suffix", "middle")


def eval_set_upload(tenant: Tenant, *, adapter: Adapter, cases: Any, actor: str) -> EvalSet:
    """Replace the adapter's FIM eval set; every case names its fields' problems."""
    if not isinstance(cases, list) or not cases:
        raise ValidationFailed("cases: send a non-empty list of {prefix, suffix, middle}")
    if len(cases) > MAX_EVAL_CASES:
        raise ValidationFailed(f"cases: at most {MAX_EVAL_CASES} cases, got {len(cases)}")
    for index, case in enumerate(cases):
        if not isinstance(case, dict) or set(case) != set(_EVAL_FIELDS):
            raise ValidationFailed(f"cases[{index}]: must hold exactly prefix, suffix and middle")
        for name in _EVAL_FIELDS:
            if not isinstance(case[name], str) or "\x00" in case[name]:
                raise ValidationFailed(f"cases[{index}].{name}: must be a string without NUL characters")
            if len(case[name]) > MAX_EVAL_CHARS[name]:
                raise ValidationFailed(
                    f"cases[{index}].{name}: at most {MAX_EVAL_CHARS[name]:,} characters, got {len(case[name]):,}"
                )
    with transaction.atomic():
        eval_set, _ = EvalSet.objects.update_or_create(adapter=adapter, defaults={"tenant": tenant, "cases": cases})
        audit_record(
            tenant,
            actor=actor,
            action="eval_set.upload",
            target_type="adapter",
            target_id=adapter.name,
            data={"cases": len(cases)},
        )
    return eval_set
