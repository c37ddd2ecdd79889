"""Training samples: one served completion, the tokens exactly as served, and its reward.

One typed object per sample. The exporter (``apps/training/dataset.py``) builds them in memory
with ``Sample.build`` and hands the list to the trainer, which takes it as it is: nothing is
written to a file or parsed again on that path. Only where samples cross a file boundary, the
command line's ``python -m gpu_trainer train --data``, are they read from JSONL, one JSON object a
line (``load_samples``, ``Sample.from_dict``)::

    {"prompt_token_ids": [int], "completion_token_ids": [int],
     "behaviour_logprobs": [float] | null, "reward": float, "id": "optional", "silent": false,
     "silence_reward": float | null, "token_rewards": [float] | null,
     "preferred_token_ids": [int] | null}

An empty ``completion_token_ids`` is the "stay silent" action: the model emitted EOS first.
The trainer trains it as the single token ``[eos_id]`` whose serving logprob is unknown.
``silent`` (optional) says the served text was empty although tokens were served: a client's
stop string cut the completion at its first token (a line break for a single-line editor), so
that token is one way this adapter's clients see silence. ``silence_reward`` (optional) is what
staying silent would have earned on this prompt, for the counterfactual silent action; absent,
the config's ``silence_reward`` (the policy's "not shown"). An agent's turn carries its own: an
agent that answers nothing leaves its user to ask again.

``token_rewards`` (optional) is token-level credit, one finite number per completion token: a
partial accept or an edit says which tokens the user kept (rewarded), the first one they did not
(penalised) and the rest (0). The policy gradient then uses each token's own advantage, centred
on the scalar rewards' baseline and, when advantages are normalised, divided by the spread of the
advantages the update uses, tokens included (``losses.token_advantages``); ``reward`` still stands for the whole
completion in the batch baseline, the silent counterfactual and the gate. Absent, every token
shares the sample's advantage, exactly as before.

``preferred_token_ids`` (optional) is an edit's kept text as tokens: what the user wrote in the
completion's place. With ``preference_coef`` > 0 the update prefers it to the served completion
(``preference``); otherwise it is carried and not read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learning_shared.errors import TrainerInputError


@dataclass(frozen=True)
class Sample:
    """One served completion and its reward."""

    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...] | None
    reward: float
    id: str | None = None
    silent: bool = False
    silence_reward: float | None = None
    token_rewards: tuple[float, ...] | None = None
    preferred_token_ids: tuple[int, ...] | None = None

    @classmethod
    def build(
        cls,
        *,
        prompt_token_ids: Sequence[int],
        completion_token_ids: Sequence[int],
        reward: float,
        behaviour_logprobs: Sequence[float] | None = None,
        id: str | None = None,
        silent: bool = False,
        silence_reward: float | None = None,
        token_rewards: Sequence[float] | None = None,
        preferred_token_ids: Sequence[int] | None = None,
        where: str = "sample",
    ) -> Sample:
        """One sample from typed values (the exporter's way in): checks what the types cannot say
        (a prompt, finite numbers, one logprob and one reward per completion token) and normalises
        silence (no behaviour logprob for the EOS the trainer adds; ``silent`` set). ``where``
        names the sample in errors."""
        if not prompt_token_ids:
            raise TrainerInputError(f"{where}: prompt_token_ids is empty")
        if not math.isfinite(reward):
            raise TrainerInputError(f"{where}: reward must be a finite number, got {reward!r}")
        behaviour = behaviour_logprobs
        if behaviour is not None:
            bad = next((i for i, x in enumerate(behaviour) if not math.isfinite(x) or x > 1e-4), None)
            if bad is not None:
                raise TrainerInputError(
                    f"{where}: behaviour_logprobs[{bad}] = {behaviour[bad]!r} is not a finite log-probability"
                )
            if completion_token_ids and len(behaviour) != len(completion_token_ids):
                raise TrainerInputError(
                    f"{where}: behaviour_logprobs has {len(behaviour)} entries but "
                    f"completion_token_ids has {len(completion_token_ids)}"
                )
            # Silence: the EOS logprob may or may not have been logged; it is unknown either way.
            if not completion_token_ids:
                behaviour = None
        if silence_reward is not None and not math.isfinite(silence_reward):
            raise TrainerInputError(f"{where}: silence_reward must be a finite number or null, got {silence_reward!r}")
        credit = _token_rewards(token_rewards, completion_token_ids, where)
        if preferred_token_ids is not None and not preferred_token_ids:
            raise TrainerInputError(f"{where}: preferred_token_ids is empty (null when there is no kept text)")
        return cls(
            prompt_token_ids=tuple(prompt_token_ids),
            completion_token_ids=tuple(completion_token_ids),
            behaviour_logprobs=tuple(float(x) for x in behaviour) if behaviour is not None else None,
            reward=float(reward),
            id=str(id) if id is not None else None,
            silent=silent or not completion_token_ids,
            silence_reward=float(silence_reward) if silence_reward is not None else None,
            token_rewards=credit,
            preferred_token_ids=tuple(preferred_token_ids) if preferred_token_ids is not None else None,
        )

    @classmethod
    def from_dict(cls, data: Any, index: int) -> Sample:
        """Parse one JSON object read from a file (``load_samples``): its JSON types are checked
        here, its values by ``build``; ``index`` names it in errors."""
        where = f"sample {index}"
        if not isinstance(data, dict):
            raise TrainerInputError(f"{where}: expected a JSON object, got {type(data).__name__}")
        for key in ("prompt_token_ids", "completion_token_ids", "reward"):
            if key not in data:
                raise TrainerInputError(f"{where}: missing field {key!r}")
        prompt = _int_list(data["prompt_token_ids"], f"{where}: prompt_token_ids")
        completion = _int_list(data["completion_token_ids"], f"{where}: completion_token_ids")
        reward = data["reward"]
        if not _is_number(reward):
            raise TrainerInputError(f"{where}: reward must be a finite number, got {reward!r}")
        behaviour = data.get("behaviour_logprobs")
        if behaviour is not None and (not isinstance(behaviour, list) or not all(_is_number(x) for x in behaviour)):
            raise TrainerInputError(f"{where}: behaviour_logprobs must be a list of numbers or null")
        silent = data.get("silent", False)
        if not isinstance(silent, bool):
            raise TrainerInputError(f"{where}: silent must be true or false, got {silent!r}")
        silence_reward = data.get("silence_reward")
        if silence_reward is not None and not _is_number(silence_reward):
            raise TrainerInputError(f"{where}: silence_reward must be a finite number or null, got {silence_reward!r}")
        token_rewards = data.get("token_rewards")
        if token_rewards is not None and (
            not isinstance(token_rewards, list) or not all(_is_number(x) for x in token_rewards)
        ):
            raise TrainerInputError(f"{where}: token_rewards must be a list of numbers or null")
        preferred = data.get("preferred_token_ids")
        if preferred is not None:
            preferred = _int_list(preferred, f"{where}: preferred_token_ids")
        return cls.build(
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            behaviour_logprobs=behaviour,
            reward=reward,
            id=data.get("id"),
            silent=silent,
            silence_reward=silence_reward,
            token_rewards=token_rewards,
            preferred_token_ids=preferred,
            where=where,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_token_ids": list(self.prompt_token_ids),
            "completion_token_ids": list(self.completion_token_ids),
            "behaviour_logprobs": list(self.behaviour_logprobs) if self.behaviour_logprobs is not None else None,
            "reward": self.reward,
            "id": self.id,
            "silent": self.silent,
            "silence_reward": self.silence_reward,
            "token_rewards": list(self.token_rewards) if self.token_rewards is not None else None,
            "preferred_token_ids": list(self.preferred_token_ids) if self.preferred_token_ids is not None else None,
        }


def _token_rewards(value: Sequence[float] | None, completion: Sequence[int], where: str) -> tuple[float, ...] | None:
    """One finite number per completion token, or None (absent, null, or empty for silence)."""
    if value is None:
        return None
    if len(value) != len(completion):
        raise TrainerInputError(
            f"{where}: token_rewards has {len(value)} entries but completion_token_ids has {len(completion)}"
        )
    bad = next((i for i, x in enumerate(value) if not math.isfinite(x)), None)
    if bad is not None:
        raise TrainerInputError(f"{where}: token_rewards[{bad}] = {value[bad]!r} is not a finite number")
    return tuple(float(x) for x in value) if value else None


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in value):
        raise TrainerInputError(f"{where} must be a list of integers")
    return value


def load_samples(path: str | Path) -> list[Sample]:
    """Read a JSONL file of samples (blank lines skipped); errors name the 0-based sample index."""
    samples: list[Sample] = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrainerInputError(f"sample {len(samples)} (line {line_no}): invalid JSON: {exc}") from None
            samples.append(Sample.from_dict(data, len(samples)))
    return samples


def require_samples(samples: Sequence[Sample]) -> list[Sample]:
    """The trainer's entry points take typed samples: a plain dict here is a caller that skipped
    ``Sample.build`` (in memory) or ``load_samples`` (from a file), named at once, not parsed."""
    stray = next((i for i, s in enumerate(samples) if not isinstance(s, Sample)), None)
    if stray is not None:
        raise TypeError(
            f"sample {stray} is a {type(samples[stray]).__name__}, not a Sample: build samples with "
            "Sample.build, or read them from a file with load_samples"
        )
    return list(samples)


def silent_token_ids(samples: list[Sample], eos_id: int) -> list[int]:
    """The first tokens that mean "nothing shown" for these samples' clients: EOS, and the one
    token of every silent sample served as a single token (a stop string cut it at once)."""
    cut_at_once = {s.completion_token_ids[0] for s in samples if s.silent and len(s.completion_token_ids) == 1}
    return sorted({eos_id} | cut_at_once)


def check_samples_against_vocab(samples: list[Sample], vocab_size: int) -> None:
    """Refuse an empty dataset and token ids the model cannot embed."""
    if not samples:
        raise TrainerInputError("dataset is empty: nothing to train on")
    for index, sample in enumerate(samples):
        for field_name in ("prompt_token_ids", "completion_token_ids", "preferred_token_ids"):
            ids = getattr(sample, field_name) or ()
            bad = next((i for i, t in enumerate(ids) if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise TrainerInputError(
                    f"sample {index}: {field_name}[{bad}] = {ids[bad]} is outside the vocabulary [0, {vocab_size})"
                )
