"""The specialisation benchmark's records and figures: a tenant's state through its rounds, each
round's record, and the ``NAME.key: value`` figures ``benchmarks/specialise.py`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.expected import Expected, paired_difference
from benchmarks.policy import relative_lift
from benchmarks.simdev import Request, Summary
from benchmarks.simdev.codebases import Codebase
from learning_shared.show_filter import ShowEvent


@dataclass
class RoundRecord:
    """One round of one tenant: what the trainer did and what the eval gate said."""

    number: int
    events: int
    heldout: int
    kl_to_base: float
    approx_kl: float
    passed: bool
    reasons: list[str]
    poisoned: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)  # this round's own trainer overrides (--round-set)
    gate: dict[str, float] = field(default_factory=dict)  # the eval gate's numbers behind its verdict
    figures: dict[str, float] = field(default_factory=dict)  # its own unseen files, with --eval-each-round


@dataclass
class Tenant:
    """A simulated tenant's state through the rounds: its current version and its records."""

    codebase: Codebase
    adapter: Path | None = None
    threshold: float | None = None  # the current version's show filter
    base_window: list[ShowEvent] = field(default_factory=list)  # the base model's first round, shown events
    window: list[ShowEvent] = field(default_factory=list)  # the current version's training events
    rounds: list[RoundRecord] = field(default_factory=list)
    gates: dict[str, dict[str, Any]] = field(default_factory=dict)  # the show filters at the final evaluation

    @property
    def name(self) -> str:
        return self.codebase.name


def gate_numbers(verdict: Any) -> dict[str, float]:
    """The verdict's numbers worth a figure: KL to the parent, the off-policy reward gain and the
    eval set's edit-similarity gain (candidate − parent) with the paired interval the FIM check
    decided on (``_low``, ``_high``), and the feedback check's ROC AUC of the window, ``nan``
    where a check was skipped."""
    nan = float("nan")

    def gain(new: float | None, old: float | None) -> float:
        return nan if new is None or old is None else new - old

    fim_new, fim_old = verdict.fim_candidate or {}, verdict.fim_parent or {}
    interval = verdict.fim_interval or {}
    return {
        "kl_to_parent": nan if verdict.kl_to_parent is None else float(verdict.kl_to_parent),
        "reward_gain": gain(verdict.reward_candidate, verdict.reward_parent),
        "eval_set_similarity_gain": gain(fim_new.get("edit_similarity"), fim_old.get("edit_similarity")),
        "eval_set_similarity_gain_low": nan if interval.get("low") is None else float(interval["low"]),
        "eval_set_similarity_gain_high": nan if interval.get("high") is None else float(interval["high"]),
        "feedback_auc": float((verdict.feedback_direction or {}).get("auc", nan)),
    }


def round_line(r: RoundRecord) -> str:
    extra = "".join(f", {k} {v:.4f}" for k, v in {**{f"gate {k}": v for k, v in r.gate.items()}, **r.figures}.items())
    marks = ([" (inverted feedback)"] if r.poisoned else []) + [
        f" (trainer overrides {', '.join(f'{k}={v}' for k, v in r.overrides.items())})" if r.overrides else ""]
    return (f"round {r.number}{''.join(marks)}: {r.events} events, {r.heldout} held "
            f"out, KL to base {r.kl_to_base:.4f}, approx KL {r.approx_kl:.4f}, eval gate "
            f"{'passed' if r.passed else 'rejected'}{extra}")


def print_rounds(tenant: Tenant) -> None:
    for r in tenant.rounds:
        print(round_line(r))


def tenant_figures(name: str, tenant: Tenant, summaries: dict[str, Summary], expected: dict[str, Expected],
                   requests: dict[str, list[Request]]) -> dict[str, float]:
    """The tenant's figures as ``NAME.key`` pairs (module docstring)."""
    out: dict[str, float] = {}
    for model, s in summaries.items():
        out[f"{model}_accept_rate"] = s.accept_rate.value
        out[f"{model}_accepted_per_request"] = s.accepted_per_request.value
        out[f"{model}_retained_chars_per_request"] = s.retained_chars_per_request.value
    base = summaries["base"].accepted_per_request.value

    def accepted(model: str) -> list[float]:
        return [float(r.accepted) for r in requests[model]]

    own_adapter = "adapter_only" if "adapter_only" in summaries else "version"
    for key, model in (("own_version", "version"), ("own_adapter", own_adapter)):
        out[f"{key}_accepted_per_request_lift"] = relative_lift(summaries[model].accepted_per_request.value, base)
        out[f"{key}_accept_rate_lift"] = relative_lift(summaries[model].accept_rate.value,
                                                       summaries["base"].accept_rate.value)
        gain = paired_difference(accepted(model), accepted("base"))
        out.update({f"{key}_accepted_per_request_gain": gain.value, f"{key}_accepted_per_request_gain_low": gain.low,
                    f"{key}_accepted_per_request_gain_high": gain.high})
    others = [m for m in summaries if m.startswith("other_")]
    if others:
        best = max(others, key=lambda m: summaries[m].accepted_per_request.value)
        margin = paired_difference(accepted(own_adapter), accepted(best))
        out.update({"specialisation_margin": margin.value, "specialisation_margin_low": margin.low,
                    "specialisation_margin_high": margin.high,
                    "specialisation_margin_relative": relative_lift(summaries[own_adapter].accepted_per_request.value,
                                                                    summaries[best].accepted_per_request.value)})
        if own_adapter in expected and best in expected and "base" in expected:
            lift = relative_lift(expected[own_adapter].figures()["accepted_per_request"],
                                 expected["base"].figures()["accepted_per_request"])
            e_margin = paired_difference(expected[own_adapter].accept, expected[best].accept)
            out.update({"expected_own_adapter_accepted_per_request_lift": lift,
                        "expected_specialisation_margin": e_margin.value,
                        "expected_specialisation_margin_low": e_margin.low,
                        "expected_specialisation_margin_high": e_margin.high})
    if "trained" in tenant.gates:
        out["gate_eval_recall"] = float(tenant.gates["trained"]["eval_recall"])
    for r in tenant.rounds:
        out[f"round{r.number}_kl_to_base"] = r.kl_to_base
        out[f"round{r.number}_gate_passed"] = float(r.passed)
        for key, value in r.gate.items():
            out[f"round{r.number}_gate_{key}"] = value
        for key, value in r.figures.items():
            out[f"round{r.number}_{key}"] = value
    return {f"{name}.{key}": value for key, value in out.items()}
