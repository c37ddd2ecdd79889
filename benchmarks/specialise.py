"""Specialisation benchmark: does each tenant's adapter get better at *its own* codebase?

Each ``--codebase NAME=DIR`` is a simulated tenant: a folder of Python files, split once into
training and unseen files by a seeded hash of each file's path (``simdev.codebases``), and
developers of ``--population`` who answer suggestions on its code. Each tenant runs the loop on
its training files alone, round after round:

1. collect: its current version (the base model first) serves ``--train-tasks`` fresh tasks of its
   training files, sampled as serving samples them; its developers decide each suggestion;
2. export: the events become the trainer's samples as the exporter builds them (token-level
   credit of a partial accept or an edit); ``--heldout-fraction`` of them are kept for the gate;
3. train: PPO (``gpu_trainer.ppo.train_ppo``) continues the tenant's current adapter;
4. gates: the show filter is fitted on the round's training events, and the eval gate
   (``gpu_trainer.gate.evaluate_candidate``: KL to the parent, off-policy reward on the held-out
   events, each version behind its show filter) decides whether the candidate replaces the
   current version. A rejected candidate is dropped and the tenant keeps its version, as the loop does.

``--poison-round K`` makes round K's feedback inverted (a client that reported every outcome the
wrong way round): the case the eval gate exists for.

Then every codebase's **unseen** files are served by the base model, each tenant's adapter, and each
tenant's version (adapter + show filter) on its own files, with the same sampling seeds, and the
table gives, per tenant: accept rate of shown, accepted per request and retained characters per
request (each with a 95 % interval) for the base model, its own version, its own adapter and the
other tenants' adapters; the lifts of its version and adapter over the base, and the
*specialisation margin*: its own adapter's accepted per request minus the best other tenant's
adapter's, on its own unseen files, paired over the same tasks, with its 95 % interval. For the
``line`` developer the same comparisons are also computed from the models' probabilities
(``expected.py``: no sampling noise). ``--eval-each-round`` also evaluates each tenant's own unseen
files after every round (version, adapter, the show filter's recall there, KL to the base model).

Output: the table, then one ``name: value`` line per figure, per tenant ``NAME.…``, among them
``NAME.own_version_accepted_per_request_lift``, ``NAME.own_adapter_accepted_per_request_lift`` and
``NAME.specialisation_margin`` (with ``_low`` / ``_high`` for the paired intervals).

    python benchmarks/specialise.py --codebase NAME=DIR --codebase NAME=DIR [--model smollm2]
        [--population line|block] [--train-tasks 256] [--eval-tasks 300] [--rounds 3] [--seed 0]
        [--split-seed 0] [--unseen-share 0.3] [--set key=value ...] [--device auto] [--eval-each-round]
        [--poison-round K] [--out DIR]
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.expected import Expected  # noqa: E402
from benchmarks.learning import Evaluation, describe  # noqa: E402
from benchmarks.policy import (  # noqa: E402
    format_value,
    load_tokenizer_of,
    parse_overrides,
    resolve_model,
    run_policy,
    show_events,
    to_samples,
    train_run,
)
from benchmarks.simdev import POPULATIONS, Context, Request, Summary, Task, summarise  # noqa: E402
from benchmarks.simdev.codebases import DEFAULT_UNSEEN_SHARE, Codebase  # noqa: E402
from benchmarks.specialise_report import (  # noqa: E402
    RoundRecord,
    Tenant,
    gate_numbers,
    print_rounds,
    round_line,
    tenant_figures,
)
from learning_shared.samples import Sample  # noqa: E402
from learning_shared.show_filter import fit_show_threshold  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/specialise.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--codebase", action="append", default=[], metavar="NAME=DIR", required=True,
                        help="a tenant and the folder of its Python files (repeatable; at least two)")
    parser.add_argument("--model", default="smollm2",
                        help="base model: smollm2 (default), starter-tiny, starter-small or a model directory")
    parser.add_argument("--population", choices=POPULATIONS, default="line")
    parser.add_argument("--train-tasks", type=int, default=256, help="events collected per tenant and round")
    parser.add_argument("--eval-tasks", type=int, default=300, help="tasks of each codebase's unseen files")
    parser.add_argument("--rounds", type=int, default=3, help="collect-train-gate rounds per tenant")
    parser.add_argument("--seed", type=int, default=0, help="task selection, sampling and trainer seed")
    parser.add_argument("--split-seed", type=int, default=0, help="the seed of the training/unseen file split")
    parser.add_argument("--unseen-share", type=float, default=DEFAULT_UNSEEN_SHARE,
                        help="share of each codebase's files that are unseen")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="trainer config override, e.g. --set learning_rate=5e-4")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each request")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (serving's default)")
    parser.add_argument("--stop", action="append", default=[], type=lambda text: codecs.decode(text, "unicode_escape"),
                        help="a stop string the client sends with each request (backslash escapes read, e.g. "
                             "'\\n\\n' for a multi-line client; repeatable; default none)")
    parser.add_argument("--pass-tokens", type=int, default=4096, help="token budget of one sampling pass")
    parser.add_argument("--prefix-chars", type=int, default=500,
                        help="the most characters of the file before the cursor that a request carries")
    parser.add_argument("--heldout-fraction", type=float, default=0.1,
                        help="share of each round's events kept out of training for the eval gate (the loop's 0.1)")
    parser.add_argument("--gate-recall", type=float, default=0.95, help="the show filter's recall of accepted")
    parser.add_argument("--eval-each-round", action="store_true",
                        help="evaluate each tenant's own unseen files after every round")
    parser.add_argument("--poison-round", type=int, default=0,
                        help="invert the feedback of this round, held-out events included (every tenant), as a client "
                             "that reports every outcome the wrong way round: what the eval gate makes of it")
    parser.add_argument("--round-set", action="append", default=[], metavar="K:KEY=VALUE",
                        help="a trainer override for round K alone (repeatable), e.g. 2:learning_rate=1e-2: a round "
                             "that oversteps, as a tenant's allowed overrides can make one, for the eval gate to judge")
    parser.add_argument("--eval-set-cases", type=int, default=0,
                        help="give each tenant an uploaded eval set for the gate's FIM check: this many tasks of its "
                             "training files that no round trains on (default 0: none, as a tenant that uploaded none)")
    parser.add_argument("--gate-history", type=int, default=0, metavar="N",
                        help="also give the eval gate up to N events held out of earlier rounds (default 0: this "
                             "round's alone, as the loop does)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="tenants whose rounds run at once, each in its own process (a GPU has room for several)")
    parser.add_argument("--no-expected", action="store_true", help="skip the line developer's expected outcomes")
    parser.add_argument("--device", default="auto", help="auto (a GPU when there is one), cpu or cuda")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TRAINER_CPU_THREADS", "1")),
                        help="torch CPU threads (default $TRAINER_CPU_THREADS or 1)")
    parser.add_argument("--out", help="keep adapters and events here (default: a temporary folder)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from gpu_trainer.config import PPOConfig
    from learning_shared.errors import TrainerInputError

    torch.set_num_threads(max(1, args.threads))
    for name in ("train_tasks", "eval_tasks", "rounds", "prefix_chars", "jobs"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1")
    if not 0.0 <= args.heldout_fraction < 1.0:
        raise SystemExit("error: --heldout-fraction must be within [0, 1)")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.no_gate = False  # the learning benchmark's helpers read it: the show filter is always on here
    try:
        codebases = [Codebase.parse(spec, seed=args.split_seed, unseen_share=args.unseen_share)
                     for spec in args.codebase]
        overrides = parse_overrides(args.set)
        args.round_overrides = round_overrides(args.round_set)
        config = PPOConfig.from_dict({"seed": args.seed, "device": args.device, "dtype": "float32", **overrides})
        args.silence_gated_set = "silence_gated" in overrides
        for number, changes in args.round_overrides.items():
            try:
                config.replace(**changes)
            except TypeError:
                raise ValueError(f"--round-set {number}: not a trainer setting: {', '.join(changes)}") from None
    except (ValueError, TrainerInputError) as exc:
        raise SystemExit(f"error: {exc}") from None
    names = [c.name for c in codebases]
    if len(set(names)) != len(names) or len(names) < 2:
        raise SystemExit("error: --codebase: at least two tenants, each with its own name")
    model_dir = resolve_model(args.model)
    context = Context(max_prefix_chars=args.prefix_chars)
    started = time.monotonic()
    print(f"model {model_dir.name} on {args.device}, population {args.population}, {args.rounds} round(s) of "
          f"{args.train_tasks} events per tenant, {args.eval_tasks} unseen tasks per codebase, seed {args.seed}",
          flush=True)
    for c in codebases:
        print(f"codebase {c.name}: {c.root} ({len(c.files('training'))} training files, "
              f"{len(c.files('unseen'))} unseen)", flush=True)
    if overrides:
        print(f"trainer overrides: {json.dumps(overrides)}", flush=True)

    unseen = {c.name: c.tasks("unseen", args.eval_tasks, seed=args.seed, context=context) for c in codebases}
    evaluations = {name: Evaluation(model_dir, tasks, args) for name, tasks in unseen.items()}  # the final grid
    with tempfile.TemporaryDirectory(prefix="strop-specialise-") as tmp:
        work = Path(args.out) if args.out else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        jobs = [(Tenant(c), model_dir, config, args, work, context, unseen[c.name]) for c in codebases]
        if args.jobs == 1:
            done = [tenant_rounds(*job) for job in jobs]
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                done = list(pool.map(tenant_rounds, *zip(*jobs, strict=True)))
        tenants = {t.name: t for t in done}
        results = {name: evaluate(name, tenants, evaluations[name], args) for name in tenants}
    print(f"\n{args.population} developers, {len(tenants)} tenants ({time.monotonic() - started:.0f} s in all):")
    values: dict[str, float] = {}
    for name, (summaries, expected, requests) in results.items():
        print(f"\n== {name}: its own unseen files ({len(unseen[name])} tasks) ==")
        for model, summary in summaries.items():
            print(describe(model, summary))
        print_rounds(tenants[name])
        values.update(tenant_figures(name, tenants[name], summaries, expected, requests))
    print()
    for key, value in values.items():
        print(f"{key}: {format_value(value)}", flush=True)
    return 0


def tenant_rounds(tenant: Tenant, model_dir: Path, config: Any, args: argparse.Namespace, work: Path,
                  context: Context, unseen: list[Task]) -> Tenant:
    """``run_rounds`` for one tenant, in this process or another (``--jobs``); the tenant as it ends."""
    import torch

    torch.set_num_threads(max(1, args.threads))
    run_rounds(tenant, model_dir, load_tokenizer_of(model_dir), config, args, work, context,
               Evaluation(model_dir, unseen, args))
    return tenant


def run_rounds(tenant: Tenant, model_dir: Path, tokenizer: Any, config: Any, args: argparse.Namespace, work: Path,
               context: Context, evaluation: Evaluation) -> None:
    """The tenant's rounds on its training files: collect, export, train, gates."""
    from gpu_trainer.gate import GateConfig, evaluate_candidate

    trained_on = args.train_tasks * args.rounds
    tasks = tenant.codebase.tasks("training", trained_on + args.eval_set_cases, seed=args.seed, context=context)
    # Its uploaded eval set: cases of its own training files that no round's window holds.
    eval_set = [{"prefix": t.prefix, "suffix": t.suffix_for(args.population), "middle": t.middle(args.population)}
                for t in tasks[trained_on:]]
    tasks = tasks[:trained_on]
    history: list[Sample] = []  # earlier rounds' held-out events: never trained on
    for number in range(1, args.rounds + 1):
        batch = tasks[(number - 1) * args.train_tasks: number * args.train_tasks]
        if not batch:
            print(f"{tenant.name} round {number}: no training tasks left", flush=True)
            break
        label = f"{tenant.name} round {number}"
        served, requests, _ = run_policy(model_dir, tenant.adapter, batch, args, label=f"{label}: collect",
                                         seed=args.seed * 1_000_003 + 7919 * number)
        events = show_events(served, requests, batch)
        if number == 1:
            tenant.base_window = events
        samples = to_samples(served, requests, tokenizer)
        poisoned = number == args.poison_round
        if poisoned:
            samples = [inverted(s) for s in samples]
        rng = random.Random(f"heldout:{args.seed}:{tenant.name}:{number}")
        held = [rng.random() < args.heldout_fraction for _ in samples]
        train_samples = [s for s, h in zip(samples, held, strict=True) if not h]
        heldout = [s for s, h in zip(samples, held, strict=True) if h]
        # The show filter sees the training part's shown events, as the loop fits it.
        train_ids = {s.id for s in train_samples}
        shown_tasks = [t for t, r in zip(batch, requests, strict=True) if r.shown]
        window = [e for e, t in zip(events, shown_tasks, strict=True) if t.id in train_ids]
        if poisoned:
            window = [replace(e, accepted=not e.accepted) for e in window]
        print(f"{label} events: {summarise(requests)}", flush=True)
        # As the loop: the show filter first, since whether there is one decides who teaches silence.
        fitted = fit_show_threshold(window, recall=args.gate_recall)
        threshold = None if fitted is None else float(fitted["threshold"])
        round_config = config.replace(seed=args.seed + number - 1, **args.round_overrides.get(number, {}))
        if number in args.round_overrides:
            print(f"{label}: trainer overrides for this round: {json.dumps(args.round_overrides[number])}", flush=True)
        if not args.silence_gated_set:
            round_config = round_config.replace(silence_gated=threshold is not None)
        result = train_run(model_dir, train_samples, round_config, work / f"{tenant.name}-round{number}",
                           tenant.adapter, label=label)
        verdict = evaluate_candidate(
            base_model_dir=model_dir, parent_adapter_dir=tenant.adapter, candidate_adapter_dir=result.out_dir,
            heldout=heldout + history[-args.gate_history:] if args.gate_history else heldout,
            fim_eval=eval_set or None,
            # float32 as the policies are served and trained here (the gate's own default on a GPU is bf16)
            config=GateConfig.from_dict({"seed": args.seed + number, "device": args.device, "dtype": "float32",
                                         "max_tokens_per_pass": args.pass_tokens}),
            kl_prompts=[list(s.prompt_token_ids) for s in train_samples[:32]],
            candidate_show_threshold=threshold, parent_show_threshold=tenant.threshold, silence_reward=0.0,
            window_show_events=window,
        )
        record = RoundRecord(number, len(train_samples), len(heldout),
                             float(result.summary.get("final_kl_to_base", float("nan"))),
                             float(result.summary.get("final_approx_kl", float("nan"))),
                             verdict.passed, list(verdict.reasons), poisoned,
                             dict(args.round_overrides.get(number, {})), gate_numbers(verdict))
        print(f"{label} eval gate: {'passed' if verdict.passed else 'REJECTED'}: {'; '.join(verdict.reasons)}",
              flush=True)
        history.extend(heldout)
        if verdict.passed:
            tenant.adapter, tenant.threshold, tenant.window = result.out_dir, threshold, window
        if args.eval_each_round and number < args.rounds:
            summaries, _, gates = evaluation.run({"trained": tenant.adapter},
                                                 {"base": tenant.base_window, "trained": tenant.window})
            record.figures = {
                "version_accepted_per_request": summaries["trained"].accepted_per_request.value,
                "adapter_accepted_per_request": summaries.get("adapter_only", summaries["trained"])
                .accepted_per_request.value,
                "version_accept_rate": summaries["trained"].accept_rate.value,
                "gate_eval_recall": float(gates.get("trained", {}).get("eval_recall", float("nan"))),
            }
        tenant.rounds.append(record)
        print(f"{tenant.name} {round_line(record)}", flush=True)


def round_overrides(pairs: list[str]) -> dict[int, dict[str, Any]]:
    """``--round-set K:KEY=VALUE`` pairs by round; a ``ValueError`` names a malformed one."""
    by_round: dict[int, list[str]] = {}
    for pair in pairs:
        number, sep, setting = pair.partition(":")
        if not sep or not number.strip().isdigit() or int(number) < 1:
            raise ValueError(f"--round-set {pair!r}: expected K:KEY=VALUE with a round K >= 1")
        by_round.setdefault(int(number), []).append(setting)
    return {number: parse_overrides(settings) for number, settings in by_round.items()}


def inverted(sample: Sample) -> Sample:
    """The sample as a client reporting every outcome the wrong way round would have it recorded."""
    rewards = None if sample.token_rewards is None else tuple(-r for r in sample.token_rewards)
    return replace(sample, reward=-sample.reward, token_rewards=rewards)


def evaluate(name: str, tenants: dict[str, Tenant], evaluation: Evaluation, args: argparse.Namespace
             ) -> tuple[dict[str, Summary], dict[str, Expected], dict[str, list[Request]]]:
    """Tenant ``name``'s unseen files under the base model, its own version and adapter, and every
    other tenant's adapter; the summaries, expected outcomes and requests by model."""
    own = tenants[name]
    policies: dict[str, Path | None] = {"trained": own.adapter}
    policies.update({f"other_{other}": t.adapter for other, t in tenants.items() if other != name})
    windows = {"base": own.base_window, "trained": own.window}
    summaries, expected, gates = evaluation.run(policies, windows)
    for model, fitted in gates.items():
        print(f"{name}: show filter of {'its version' if model == 'trained' else 'the base model'}: recall "
              f"{fitted['eval_recall']} of what developers took on its unseen files (fitted at {fitted['fit_recall']})")
    summaries = {("version" if k == "trained" else k): v for k, v in summaries.items()}
    expected = {("version" if k == "trained" else k): v for k, v in expected.items()}
    requests = {("version" if k == "trained" else k): v for k, v in evaluation.requests.items()}
    own.gates = gates
    return summaries, expected, requests




if __name__ == "__main__":
    sys.exit(main())
