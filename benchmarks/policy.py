"""The learning benchmarks' policy: resolving and loading a model (with an adapter), serving tasks
with it as vLLM samples them and letting the simulated developer decide, turning the events into
the trainer's samples, training an adapter on them, and the show filter's view of the events.
``benchmarks/learning.py`` (code completion) and ``benchmarks/agent_learning.py`` (agents) share it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.expected import Expected, expected_outcomes
from benchmarks.sampling import Served, sample_suggestions
from benchmarks.simdev import REWARDS, Decision, Request, Task, respond
from learning_shared.credit import event_credit
from learning_shared.samples import Sample
from learning_shared.show_filter import SHOW_ACCEPTED, ShowEvent, suggestion_score, withholds


def resolve_model(name: str) -> Path:
    """``smollm2`` (fetched and converted once), ``starter-tiny`` / ``starter-small``, or a path."""
    if name == "smollm2":
        from model_supply.base_models import ensure_smollm2

        return Path(ensure_smollm2())
    if name.startswith("starter-"):
        from model_supply.starter import ensure_starter_model

        return Path(ensure_starter_model(name.removeprefix("starter-")))
    path = Path(name)
    if not (path / "config.json").is_file():
        raise SystemExit(f"error: --model {name}: not smollm2, starter-tiny, starter-small or a model directory")
    return path


def load_model(model_dir: Path, adapter_dir: Path | None, device: str = "cpu"):
    """The base model (float32, on ``device``) with ``adapter_dir`` on it, and its tokenizer."""
    import torch

    from gpu_trainer.model_loading import load_base_model, load_tokenizer

    model = load_base_model(model_dir, torch.device(device), torch.float32)
    tokenizer = load_tokenizer(model_dir)
    if adapter_dir is not None:
        from peft import PeftModel

        from gpu_trainer.adapters import verify_adapter

        verify_adapter(adapter_dir)
        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    return model, tokenizer


def prompts_for(tasks: Sequence[Task], population: str, family: str) -> list[str]:
    from learning_shared.fim import build_fim_prompt

    return [build_fim_prompt(family, t.prefix, t.suffix_for(population)) for t in tasks]  # type: ignore[arg-type]


def computes_expected(args: argparse.Namespace) -> bool:
    """Expected outcomes are computed for the ``line`` developer at temperature 1 (what they assume)."""
    return args.population == "line" and args.temperature == 1.0 and not args.no_expected


def run_policy(model_dir: Path, adapter_dir: Path | None, tasks: Sequence[Task], args: argparse.Namespace,
               *, seed: int, label: str, expected: bool = False
               ) -> tuple[list[Served], list[Request], Expected | None]:
    """Serve every task with one policy and let the developer decide each suggestion; with
    ``expected``, also compute every task's expected outcome under the same policy."""
    from learning_shared.fim import detect_family

    model, tokenizer = load_model(model_dir, adapter_dir, getattr(args, "device", "cpu"))
    prompts = prompts_for(tasks, args.population, detect_family(model_dir))
    served = sample_suggestions(
        model, tokenizer, prompts,
        max_new_tokens=args.max_tokens, temperature=args.temperature, seed=seed, pass_tokens=args.pass_tokens,
        progress=label, stop=args.stop,
    )
    outcomes = None
    if expected:
        outcomes = expected_outcomes(model, tokenizer, prompts, tasks, line_stop="\n" in args.stop,
                                     pass_tokens=args.pass_tokens)
    del model
    requests = [
        Request.decided(respond(args.population, s.text, task), index=i, task_id=task.id, interaction_id="",
                        version=label, user="", text=s.text, finish_reason=s.finish_reason, latency_s=0.0)
        for i, (task, s) in enumerate(zip(tasks, served, strict=True))
    ]
    return served, requests, outcomes


def to_samples(served: Sequence[Served], requests: Sequence[Request], tokenizer: Any) -> list[Sample]:
    """The trainer's samples, one per event, built as the exporter builds them: a partial accept or
    an edit also carries its token-level credit, and an edit its kept text as tokens."""
    samples = []
    for s, r in zip(served, requests, strict=True):
        credit = event_credit(
            r.outcome,
            r.text,
            s.completion_token_ids,
            accepted_chars=r.accepted_chars,
            kept_text=r.kept_text,
            tokenizer=tokenizer,
            kept_reward=REWARDS["accepted"],
            rejected_reward=REWARDS["rejected"],
            persisted_reward=0.0,  # the simulated developers never report an agent's persisted edit
        )
        samples.append(Sample.build(
            id=f"{r.task_id}",
            prompt_token_ids=s.prompt_token_ids,
            completion_token_ids=s.completion_token_ids,
            behaviour_logprobs=s.logprobs,
            reward=REWARDS[r.outcome],
            silent=not s.text.strip(),  # nothing shown: what the first token did when it was all
            token_rewards=credit.token_rewards,
            preferred_token_ids=credit.preferred_token_ids,
        ))
    return samples


def train(model_dir: Path, samples: list[Sample], config, out_dir: Path, parent: Path | None,
          label: str) -> Path:
    """Train an adapter on ``samples`` (continuing ``parent``); its folder."""
    return train_run(model_dir, samples, config, out_dir, parent, label).out_dir


def train_run(model_dir: Path, samples: list[Sample], config, out_dir: Path, parent: Path | None, label: str):
    """Train an adapter on ``samples`` (continuing ``parent``); the trainer's result (its folder and
    summary), with the figures that say whether the update was healthy printed to stderr."""
    from gpu_trainer.ppo import train_ppo

    print(f"[{label}] training on {len(samples)} events ({config.baseline} baseline)", file=sys.stderr, flush=True)
    result = train_ppo(config, samples, base_model_dir=model_dir, out_dir=out_dir, parent_adapter_dir=parent,
                       progress=sys.stderr.isatty())
    summary = result.summary
    keys = ("stopped_early", "reward_mean", "final_approx_kl", "final_kl_to_base", "wall_seconds", "tokens_per_s")
    shown = {k: summary[k] for k in keys if k in summary}
    print(f"[{label}] trained: {json.dumps({'steps': result.steps, **shown}, default=str)}", file=sys.stderr,
          flush=True)
    return result


def relative_lift(new: float, old: float) -> float:
    if math.isnan(new) or math.isnan(old):
        return math.nan
    if old == 0:
        return 0.0 if new == 0 else math.inf
    return new / old - 1.0


def format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return "nan" if math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.4f}")


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``--set`` pairs; ``autocast_bf16=auto`` turns it on where bf16 is native on this CPU."""
    import torch

    from gpu_trainer.__main__ import _parse_overrides
    from gpu_trainer.precision import autocast_setting

    overrides = _parse_overrides(list(pairs))
    if overrides.get("autocast_bf16") == "auto":
        overrides["autocast_bf16"] = autocast_setting("auto", torch.device("cpu"))
    return overrides


def load_tokenizer_of(model_dir: Path) -> Any:
    from gpu_trainer.model_loading import load_tokenizer

    return load_tokenizer(model_dir)


def show_events(served: Sequence[Served], requests: Sequence[Request], tasks: Sequence[Task]) -> list[ShowEvent]:
    """The show filter's view of collected events: each shown suggestion, scored by its own logprobs,
    grouped by its file (what the fit checks itself across)."""
    return [ShowEvent(suggestion_score(s.logprobs), r.outcome in SHOW_ACCEPTED, group=f"{t.package}/{t.path}")
            for s, r, t in zip(served, requests, tasks, strict=True) if r.outcome != "not_shown"]


def gated(requests: Sequence[Request], served: Sequence[Served], threshold: float, population: str,
          tasks: Sequence[Task]) -> list[Request]:
    """The same requests behind a show filter: a suggestion scoring below ``threshold`` reaches the
    developer as nothing (``not_shown``), as serving withholds it (no exploration here)."""
    return [withheld(r, respond(population, "", task)) if withholds(suggestion_score(s.logprobs), threshold) else r
            for r, s, task in zip(requests, served, tasks, strict=True)]


def withheld(request: Request, nothing: Decision) -> Request:
    """``request`` as it is when serving withholds its suggestion: nothing shown, nothing taken, and
    so nothing in the file to keep."""
    return replace(request, text="", outcome=nothing.outcome, accepted_chars=None, kept_text=None,
                   accepted_text_chars=nothing.accepted_text_chars, retained_chars=nothing.retained_chars)
