"""The eval gate's configuration and its verdict (what the gate decided, and every number why).

No torch import here: the Django side builds gate configs from tenant settings without torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from learning_shared.errors import TrainerInputError

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class GateConfig:
    """Bounds of the eval gate. Every field has a default that works on CPU."""

    max_kl: float = 0.5
    """Upper bound (nats) on the mean per-token KL(candidate ‖ parent) over held-out completion
    positions. A PPO update is meant to move the policy a little; more than this is a jump."""
    reward_margin: float = 0.05
    """The candidate's off-policy reward estimate may be at most this much below the parent's
    (reward units: the default policy gives +0.75 accepted, −0.25 rejected)."""
    importance_cap: float = 5.0
    """Sequence importance weights are clipped to [0, cap] (truncated importance sampling):
    bounds the variance one held-out completion can add to the estimate."""
    min_heldout: int = 8
    """With fewer held-out samples the reward check is recorded as skipped, not failed: too few
    to tell a better candidate from noise. KL is still measured on whatever there is."""
    fim_margin: float = 0.02
    """How much worse than its parent the candidate may fill the eval set (edit similarity, 0–1).
    It fails when the 95 % interval of its edit similarity minus its parent's, paired by case,
    lies wholly below −fim_margin (clearly worse, by more than this, on the tenant's own cases);
    under ``learning_shared.intervals.MIN_MEAN_INTERVAL_N`` (5) cases, where the difference has no
    interval, when the mean difference is below −fim_margin. 1 turns the check off; 0 stops any
    loss the set can tell from noise."""
    feedback_direction_z: float = 4.0
    """The window's feedback fails the gate when its accepted suggestions scored *lower* than the
    other shown ones by more than this many standard errors (the ROC AUC of the suggestion's
    log-probability below 0.5: ``learning_shared.show_filter.feedback_direction``). On real code
    accepts go with the model's confidence; outcomes reported the wrong way round (a client's bug)
    turn that over, and a candidate trained on them unlearns while the other checks, which read the
    same reports, pass it. 0 turns the check off. The loop runs it before training too, so such a
    window costs no training run."""
    max_fim_samples: int = 64
    """Evaluate at most the first this many FIM cases (greedy decoding is the gate's slow part)."""
    max_new_tokens: int = 32
    """Longest decoded FIM middle, in tokens."""
    max_prompt_tokens: int = 1024
    """Held-out prompts are truncated from the left to this many tokens, as in training."""
    batch_size: int = 16
    """At most this many sequences per forward pass (and per FIM decoding batch)."""
    max_tokens_per_pass: int = 1024
    """Token budget of one forward pass, padding included, as ``PPOConfig.max_tokens_per_pass``;
    a FIM decoding pass counts each prompt plus ``max_new_tokens``."""
    seed: int = 0
    """Seeds torch before evaluation; the gate has no sampling, so this pins kernels only."""
    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu`` or ``cuda[:n]``, as in PPOConfig."""
    dtype: str = "auto"
    """``auto``: bf16 on GPU, fp32 on CPU; or ``float32`` / ``bfloat16``. Log-softmax and KL are
    always computed in fp32."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``TrainerInputError`` naming the first bad field."""
        checks: list[tuple[bool, str]] = [
            (self.max_kl > 0, "max_kl must be > 0"),
            (self.reward_margin >= 0, "reward_margin must be >= 0"),
            (self.importance_cap >= 1, "importance_cap must be >= 1"),
            (self.min_heldout >= 1, "min_heldout must be >= 1"),
            (self.fim_margin >= 0, "fim_margin must be >= 0"),
            (self.feedback_direction_z >= 0, "feedback_direction_z must be >= 0 (0: no check)"),
            (self.max_fim_samples >= 1, "max_fim_samples must be >= 1"),
            (self.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
            (self.max_prompt_tokens >= 1, "max_prompt_tokens must be >= 1"),
            (self.batch_size >= 1, "batch_size must be >= 1"),
            (self.max_tokens_per_pass >= 1, "max_tokens_per_pass must be >= 1"),
            (self.dtype in ("auto", "float32", "bfloat16"), "dtype must be auto|float32|bfloat16"),
        ]
        for ok, message in checks:
            if not ok:
                raise TrainerInputError(f"gate config: {message}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateConfig:
        """Build from a dict (e.g. tenant settings); unknown keys are an error, not ignored."""
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TrainerInputError(f"gate config: unknown field(s) {', '.join(unknown)}")
        return cls(**data)


@dataclass
class GateVerdict:
    """The gate's decision and every number behind it (stored on the TrainingRun)."""

    passed: bool = False
    reasons: list[str] = field(default_factory=list)
    """One sentence per failed check; empty when the verdict passed."""
    notes: list[str] = field(default_factory=list)
    """Why a check was skipped, and other things worth knowing that are not failures."""
    finite: bool = False
    """The candidate passed ``verify_adapter`` (finite weights, a format vLLM serves) and fits the base."""
    kl_to_parent: float | None = None
    """Mean per-token KL(candidate ‖ parent) in nats; None when there was nothing to measure it on."""
    kl_check: str = SKIPPED
    kl_positions: int = 0
    """Token positions the KL was averaged over."""
    kl_source: str | None = None
    """Where the KL was measured: ``heldout`` completions, ``kl_prompts`` or the ``fim`` prompts."""
    reward_candidate: float | None = None
    """Self-normalised, clipped importance-sampling estimate of the candidate's mean reward."""
    reward_parent: float | None = None
    """The same estimate for the parent (its logged mean reward when the data is on-policy)."""
    reward_check: str = SKIPPED
    withheld_candidate: int = 0
    """Held-out suggestions the candidate's show filter withholds: silence's reward in its estimate."""
    withheld_parent: int = 0
    """The same for the parent's show filter (production's, as served today)."""
    heldout_count: int = 0
    truncated_prompts: int = 0
    """Held-out samples whose prompt is longer than ``max_prompt_tokens``: judged on its last
    ``max_prompt_tokens`` tokens only, a context that was never served (``batching.truncated_prompts``)."""
    behaviour_known: int = 0
    """Held-out samples whose serving log-probs were logged (the rest assume the parent served them)."""
    effective_sample_size: float | None = None
    """(Σw)² / Σw² of the candidate's importance weights: near heldout_count means the estimate
    rests on many samples, near 1 means on a single one."""
    fim_candidate: dict[str, float] | None = None
    """{"exact_match", "edit_similarity"}, means over the FIM cases."""
    fim_parent: dict[str, float] | None = None
    fim_check: str = SKIPPED
    fim_rule: str | None = None
    """How the FIM check decided: ``paired`` (``fim_interval``'s upper bound against
    −fim_margin) or ``margin`` (too few cases for an interval: the mean difference against it);
    None without FIM cases."""
    fim_interval: dict[str, Any] | None = None
    """What the FIM check decided on: the candidate's edit similarity minus its parent's, paired by
    case (``fim_figures["lift"]["edit_similarity"]``: ``{"value", "low", "high", "n"}``, bounds None
    under 5 cases), and the ``bound`` it was held to: the check failed where ``high`` (``paired``)
    or ``value`` (``margin``) is below it (−fim_margin)."""
    fim_count: int = 0
    feedback_check: str = SKIPPED
    feedback_direction: dict[str, Any] | None = None
    """What the feedback check decided on: ``{"auc", "z", "accepted", "others"}`` over the window's
    shown suggestions (``learning_shared.show_filter.feedback_direction``); None when it had too
    few on either side, or no window was given."""
    fim_figures: dict[str, Any] | None = None
    """The offline evaluation a tenant reads (``learning_shared.offline_eval.fim_figures``): for the
    candidate, the parent, and the base model where the parent is an adapter, the share of cases
    whose first line is right, the share whose whole middle is, and the mean edit similarity, each
    with its 95 % interval; and the paired lift candidate − parent. None without FIM cases (and in
    verdicts stored before it existed: ``offline_eval_of`` reads both)."""
    fim_eval_set: dict[str, Any] | None = None
    """Which eval set the FIM cases came from, as the caller records it (the pipeline: the
    tenant's set, its size and when it was uploaded)."""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: non-finite floats become None (JSON has no NaN)."""
        return _json_safe(dataclasses.asdict(self))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
