"""The trainer's configuration: one dataclass, saved beside every adapter it writes.

No torch import here: the Django side builds configs from tenant settings without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Self

from learning_shared.errors import TrainerInputError

DEFAULT_LORA_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


@dataclass
class PPOConfig:
    """Critic-free PPO on a LoRA adapter. Every field has a default that works on CPU."""

    seed: int = 0
    """Seeds Python, torch and the minibatch shuffle: same seed, same data → same adapter bytes."""

    # --- advantage ---------------------------------------------------------------------------
    baseline: str = "batch_mean"
    """``batch_mean``: advantage = reward − mean reward of the batch. ``none``: the seed's raw
    reward, under which zero-reward actions (e.g. silence) get no gradient at all."""
    normalize_advantages: bool = False
    """Divide advantages by their batch standard deviation (after the baseline): that of every
    advantage the update uses, a sample's token advantages included, each sample weighing one
    (``losses.advantage_spread``). A spread below 1e-6 (rewards all alike) divides by nothing."""
    silence_counterfactual: bool = True
    """Every event also teaches the silent action, whose reward is known without showing anything
    (``silence_reward``): its advantage is silence_reward − the event's reward (a rejected
    suggestion loses to silence, an accepted one beats it), and its log-probability (of a first
    token that shows nothing: EOS, or a token the clients' stop strings cut at once, as the
    samples marked ``silent`` show) comes from the event's own forward pass. Silence is rarely
    sampled (a few percent of requests), so without this it learns only from those few; with
    it, from every event."""
    silence_gated: bool = False
    """A show filter does the staying silent for completions (``show_gate``: the loop sets this
    when it fits one for the version, which needs 10 accepted suggestions): the counterfactual
    then teaches silence only to an agent's turns (samples with their own ``silence_reward``),
    and a completion's update goes entirely to being right. Tuned on the training packages:
    accepted per request rose more without the counterfactual than with it (the figures:
    benchmarks/results-log.md, ``silence_gated``)."""
    silence_reward: float = 0.0
    """The reward of staying silent: the tenant's reward for ``not_shown`` (a sample's own
    ``silence_reward``, an agent's turn, takes precedence)."""
    silence_clip: float = 0.1
    """Trust region of the silent action in ``silence_counterfactual``: per update and context its
    probability moves by about this much at most (absolute), in log-space steps. The token
    ratio clip would let a 2 % action grow only to 2.4 % per update."""

    # --- loss --------------------------------------------------------------------------------
    clip_eps: float = 0.2
    """PPO clip range: the per-token ratio is clipped to [1 − eps, 1 + eps]."""
    loss_aggregation: str = "token_mean"
    """``token_mean``: mean over all completion tokens of the minibatch. ``sequence_mean``:
    mean per completion first, so long completions do not outweigh short ones (or silence)."""
    kl_coef: float = 0.02
    """Weight of the KL penalty to the base model (adapter disabled), k3 estimator per token,
    linear past a log-ratio of 3 (``losses.kl_to_reference``). 0 disables the penalty; the KL is
    still measured and logged."""
    measure_kl_to_base: bool = True
    """Log the KL to the base model even when kl_coef is 0. Free for a fresh LoRA (it equals
    the base at the start); costs one no-grad forward pass per update for a parent adapter."""
    importance_correction: bool = True
    """Weight each token by min(π_old / π_behaviour, cap) where serving logprobs are known,
    correcting for the policy having moved (or numerics differing) since the data was served."""
    importance_cap: float = 2.0
    """Upper bound of the importance weight (truncated importance sampling)."""

    preference_coef: float = 0.0
    """Weight of an edit's pairwise loss (``preference``): each sample with a kept text
    (``preferred_token_ids``) also teaches the policy to prefer that text to the completion it was
    shown. 0 turns it off."""
    preference_beta: float = 0.1
    """β of the pairwise loss: how far, in nats of margin between the kept and the shown text, the
    push lasts before it fades (about 2 / β)."""

    # --- optimisation ------------------------------------------------------------------------
    learning_rate: float = 1e-3
    """AdamW learning rate for the LoRA parameters. Tuned on SmolLM2 (training packages only):
    1e-4 hardly moved the policy, 3e-3 diverged (KL to the base 10 after 5 steps)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip; the pre-clip norm is logged."""
    epochs: int = 2
    """Passes over the batch per update."""
    num_minibatches: int = 4
    """Minibatches per epoch (capped by the number of samples); one optimizer step each."""
    target_kl: float | None = 0.05
    """Stop the update early once approx KL(old ‖ new) of a minibatch exceeds this. None: never."""
    max_prompt_tokens: int = 1024
    """Prompts are truncated from the left to this many tokens (the completion is kept whole)."""

    # --- memory ------------------------------------------------------------------------------
    max_tokens_per_pass: int = 1024
    """Token budget of one forward pass (prompt + completion tokens, padding included: rows ×
    longest row). Every pass (old, reference, update) is cut to it, and a minibatch larger than
    it accumulates gradients over several passes before its one optimizer step, so memory is
    bounded by this number whatever the batch. A sequence longer than the budget gets a pass of
    its own. SmolLM2-135M in fp32 on CPU keeps ~1.2 MB per token for the backward pass."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of keeping them: for long
    prompts, much less memory per token of the budget for about one more forward pass of compute."""

    # --- LoRA --------------------------------------------------------------------------------
    lora_rank: int = 8
    """LoRA rank of a fresh adapter (a parent adapter keeps its own). Must be ≤ vLLM's
    ``--max-lora-rank``."""
    lora_alpha: float = 16.0
    """LoRA alpha of a fresh adapter (scaling = alpha / rank)."""
    lora_dropout: float = 0.0
    """LoRA dropout of a fresh adapter. 0 keeps old and new logprobs identical at step 0."""
    lora_target_modules: tuple[str, ...] = DEFAULT_LORA_TARGETS
    """Module names a fresh adapter wraps (never embeddings or lm_head: vLLM serves these)."""
    max_lora_rank: int = 64
    """Refuse to write or load an adapter of higher rank (vLLM's ``--max-lora-rank``)."""

    # --- runtime -----------------------------------------------------------------------------
    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu`` or ``cuda[:n]``."""
    dtype: str = "auto"
    """``auto``: bf16 on GPU, fp32 on CPU; or ``float32`` / ``bfloat16`` explicitly."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms during training (same seed, same bytes)."""
    autocast_bf16: bool = False
    """Run every forward pass under bfloat16 autocast (matrix products in bf16; weights, LoRA,
    optimizer and log-softmax stay in ``dtype``). On a CPU with AMX the PPO update is ~1.65x
    faster than in fp32, with AVX-512 bf16 alone ~2.3x (SmolLM2), without either ~10x slower.
    Log-probs then carry bf16 rounding (~1e-2), the same in the old and new passes, so the ratio
    still starts at exactly 1. Still deterministic."""

    def __post_init__(self) -> None:
        self._check_types()
        self.lora_target_modules = tuple(self.lora_target_modules)
        self.adam_betas = (float(self.adam_betas[0]), float(self.adam_betas[1]))
        self.validate()

    def _check_types(self) -> None:
        """Each field has its default's type (an int where a float is expected is fine;
        ``target_kl`` is a number or None): ``target_kl="None"`` is a clear error, not a
        TypeError from a comparison later."""
        for f in dataclasses.fields(self):
            value, default = getattr(self, f.name), f.default
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if f.name == "target_kl":  # a number, or None for never
                ok = value is None or number
            elif isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif isinstance(default, float):
                ok = number
            elif isinstance(default, str):
                ok = isinstance(value, str)
            else:  # the tuples: a list or tuple (from JSON)
                ok = isinstance(value, (tuple, list))
            if not ok:
                raise TrainerInputError(f"config: {f.name} has the wrong type ({type(value).__name__}: {value!r})")

    def validate(self) -> None:
        """Raise ``TrainerInputError`` naming the first bad field."""
        checks: list[tuple[bool, str]] = [
            (self.baseline in ("batch_mean", "none"), "baseline must be 'batch_mean' or 'none'"),
            (self.loss_aggregation in ("token_mean", "sequence_mean"),
             "loss_aggregation must be 'token_mean' or 'sequence_mean'"),
            (self.clip_eps > 0, "clip_eps must be > 0"),
            (0 < self.silence_clip <= 1, "silence_clip must be in (0, 1]"),
            (self.kl_coef >= 0, "kl_coef must be >= 0"),
            (self.preference_coef >= 0, "preference_coef must be >= 0"),
            (self.preference_beta > 0, "preference_beta must be > 0"),
            (self.importance_cap >= 1, "importance_cap must be >= 1"),
            (self.learning_rate > 0, "learning_rate must be > 0"),
            (self.max_grad_norm > 0, "max_grad_norm must be > 0"),
            (self.epochs >= 1, "epochs must be >= 1"),
            (self.num_minibatches >= 1, "num_minibatches must be >= 1"),
            (self.target_kl is None or self.target_kl > 0, "target_kl must be > 0 or None"),
            (self.max_prompt_tokens >= 1, "max_prompt_tokens must be >= 1"),
            (self.max_tokens_per_pass >= 1, "max_tokens_per_pass must be >= 1"),
            (1 <= self.lora_rank <= self.max_lora_rank, "lora_rank must be in [1, max_lora_rank]"),
            (self.lora_alpha > 0, "lora_alpha must be > 0"),
            (0 <= self.lora_dropout < 1, "lora_dropout must be in [0, 1)"),
            (len(self.lora_target_modules) > 0, "lora_target_modules must not be empty"),
            (self.dtype in ("auto", "float32", "bfloat16"), "dtype must be auto|float32|bfloat16"),
            (isinstance(self.autocast_bf16, bool), "autocast_bf16 must be true or false"),
        ]
        for ok, message in checks:
            if not ok:
                raise TrainerInputError(f"config: {message}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        data = dataclasses.asdict(self)
        data["lora_target_modules"] = list(self.lora_target_modules)
        data["adam_betas"] = list(self.adam_betas)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Build from a dict (e.g. tenant settings); unknown keys are an error, not ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise TrainerInputError(f"config: unknown field(s) {', '.join(unknown)}")
        return cls(**data)

    def replace(self, **changes: Any) -> PPOConfig:
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)


@dataclass
class GRPOConfig(PPOConfig):
    """Offline GRPO (for comparison): the PPO loss on groups sampled from the policy itself."""

    group_size: int = 8
    """Completions sampled per prompt; advantages are normalised within each group."""
    max_new_tokens: int = 32
    """Longest sampled completion."""
    temperature: float = 1.0
    """Sampling temperature of the group rollouts."""
    rounds: int = 1
    """Sample-then-update rounds over the prompt set."""
    kl_coef: float = 0.0
    """As in PPOConfig; GRPO's comparison runs default to no KL penalty."""
    target_kl: float | None = None
    """As in PPOConfig."""
    baseline: str = field(default="batch_mean")
    """Unused: GRPO always uses the group mean and normalises by the group std."""

    def validate(self) -> None:
        super().validate()
        if self.group_size < 2:
            raise TrainerInputError("config: group_size must be >= 2")
        if self.max_new_tokens < 1:
            raise TrainerInputError("config: max_new_tokens must be >= 1")
        if self.temperature <= 0:
            raise TrainerInputError("config: temperature must be > 0")
        if self.rounds < 1:
            raise TrainerInputError("config: rounds must be >= 1")
