"""Learning benchmark: does PPO on simulated developers' feedback make a real model's suggestions
accepted more often, on code it never trained on?

1. Collect: the policy (the base model first) completes ``--train-tasks`` tasks of the training
   packages, sampled as serving samples them (prefix-only prompt for a ``plain`` model, the
   family's FIM prompt otherwise; temperature 1, top-p 1, at most ``--max-tokens`` tokens, only
   EOS stops it; token ids and their log-probs recorded as vLLM returns them, EOS included). The
   simulated developer of ``--population`` decides each suggestion; its outcome's reward
   (``REWARDS``: accepted +0.75, rejected −0.25, not shown 0) makes one training sample.
2. Train two adapters with ``gpu_trainer.ppo.train_ppo`` on the same events: the trainer's
   defaults (batch-mean baseline) and the seed's raw-reward variant (``baseline=none`` and no
   counterfactual silence: an action with reward 0, silence, gets no gradient, and a rejection
   only pushes down). A partial accept or an edit (``simdev.respond``) also carries the
   exporter's token-level credit (``learning_shared.credit``). ``--rounds`` > 1 repeats
   collect-then-train, each adapter collecting with its own policy on fresh tasks and continuing
   from its own previous adapter; the raw variant, the comparison, trains in the first round only.
   The show filter is refitted on each version's last window, checked across files
   (``learning_shared.show_filter``).
3. Evaluate the base model and both adapters on ``--eval-tasks`` tasks of the evaluation packages
   (or ``--tasks FILE.jsonl``) with the same developer, the same sampling and the same seeds.

Output: for each model its accept rate of shown suggestions, suggestions shown per request,
accepted per request and mean reward, each with a 95 % interval and the number of tasks, and the
characters its developers still kept 10 minutes later (``simdev.persistence``); for the
``line`` developer also the same figures *expected* under each model (computed per task from the
model's probabilities, no sampling noise: ``expected.py``) and the paired gain in accepted per
request over the same tasks; then one ``name: value`` line per figure (``accept_rate_lift`` and
``accepted_per_request_lift`` are relative, trained vs base; ``reward_gain`` is the difference of
mean rewards; ``expected_*`` the computed ones).

    python benchmarks/learning.py [--model DIR|smollm2|starter-tiny] [--population line|block]
        [--train-tasks 256] [--eval-tasks 200] [--rounds 1] [--seed 0] [--set key=value ...]
        [--tasks FILE.jsonl] [--adapter DIR] [--stop '\\n'] [--tune] [--variant NAME:K=V,...]
        [--skip-raw] [--out DIR] [--threads 1] [--prefix-chars 500] [--no-expected]

``--eval-each-round`` evaluates after every round (``round1_…`` figures), not only the last;
each show filter's recall of what developers took is reported on its window, on the window's
held-out files and on the evaluation tasks (``gate_window_recall``, ``gate_check_recall``,
``gate_eval_recall``). ``--adapter DIR`` evaluates an existing adapter against the base model (no training).
``--stop`` adds a stop string to every request, as a client may send one (serving applies it as
vLLM does); without one, only EOS and ``--max-tokens`` end a suggestion, as in the simulated
developers' sessions. ``--tune`` evaluates on held-out tasks of the *training* packages instead
(for tuning the trainer without ever looking at the evaluation packages); ``--variant`` trains
more adapters with other settings on the same events, and ``--skip-raw`` leaves the raw-reward
one out.
"""

from __future__ import annotations

import argparse
import codecs
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.expected import Expected, paired_difference  # noqa: E402
from benchmarks.policy import (  # noqa: E402
    computes_expected,
    format_value,
    gated,
    load_tokenizer_of,
    parse_overrides,
    relative_lift,
    resolve_model,
    run_policy,
    show_events,
    to_samples,
    train,
)
from benchmarks.sampling import Served  # noqa: E402
from benchmarks.simdev import (  # noqa: E402
    POPULATIONS,
    Context,
    Request,
    Summary,
    Task,
    load_tasks,
    read_jsonl,
    summarise,
)
from learning_shared.show_filter import (  # noqa: E402
    ShowEvent,
    fit_show_threshold,
    recall_of,
)


def describe(name: str, summary: Summary) -> str:
    return (
        f"{name}: {summary.requests} tasks, {summary.shown} shown, {summary.accepted} accepted, "
        f"{summary.partial} taken in part, {summary.edited} fixed\n"
        f"  accept rate of shown  {summary.accept_rate}\n"
        f"  shown per request     {summary.shown_per_request}\n"
        f"  accepted per request  {summary.accepted_per_request}\n"
        f"  mean reward           {summary.mean_reward}\n"
        f"  retained chars/request {summary.retained_chars_per_request}"
        f" (share of accepted {summary.retained_share:.3f})"
    )


def figures(summaries: dict[str, Summary], *, train_events: int) -> dict[str, float]:
    """Every figure as one ``name: value`` pair; lifts and gains of each trained model vs base."""
    out: dict[str, float] = {"eval_tasks": summaries["base"].requests, "train_events": train_events}
    for name, s in summaries.items():
        out[f"{name}_accept_rate"] = s.accept_rate.value
        out[f"{name}_shown_per_request"] = s.shown_per_request.value
        out[f"{name}_accepted_per_request"] = s.accepted_per_request.value
        out[f"{name}_mean_reward"] = s.mean_reward.value
        out[f"{name}_retained_chars_per_request"] = s.retained_chars_per_request.value
        out[f"{name}_retained_share"] = s.retained_share
    base = summaries["base"]
    for name, s in summaries.items():
        if name == "base":
            continue
        prefix = "" if name in ("trained", "adapter") else f"{name}_"
        out[f"{prefix}accept_rate_lift"] = relative_lift(s.accept_rate.value, base.accept_rate.value)
        out[f"{prefix}accepted_per_request_lift"] = relative_lift(
            s.accepted_per_request.value, base.accepted_per_request.value)
        out[f"{prefix}reward_gain"] = s.mean_reward.value - base.mean_reward.value
    return out


def expected_figures(expected: dict[str, Expected]) -> dict[str, float]:
    """The expected outcomes as figures: per model, then each trained model's lifts vs base and
    its paired gain in accepted per request with that gain's 95 % interval."""
    out: dict[str, float] = {}
    for name, outcome in expected.items():
        for key, value in outcome.figures().items():
            out[f"expected_{name}_{key}"] = value
    if "base" not in expected:
        return out
    base = expected["base"].figures()
    for name, outcome in expected.items():
        if name == "base":
            continue
        prefix = "" if name in ("trained", "adapter") else f"{name}_"
        values = outcome.figures()
        out[f"{prefix}expected_accept_rate_lift"] = relative_lift(values["accept_rate"], base["accept_rate"])
        out[f"{prefix}expected_accepted_per_request_lift"] = relative_lift(
            values["accepted_per_request"], base["accepted_per_request"])
        gain = paired_difference(outcome.accept, expected["base"].accept)
        out[f"{prefix}expected_accepted_per_request_gain"] = gain.value
        out[f"{prefix}expected_accepted_per_request_gain_low"] = gain.low
        out[f"{prefix}expected_accepted_per_request_gain_high"] = gain.high
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/learning.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2",
                        help="base model: smollm2 (default), starter-tiny, starter-small or a model directory")
    parser.add_argument("--population", choices=POPULATIONS, default="line")
    parser.add_argument("--train-tasks", type=int, default=256, help="events collected per round")
    parser.add_argument("--eval-tasks", type=int, default=200, help="held-out tasks (ignored with --tasks)")
    parser.add_argument("--rounds", type=int, default=1, help="collect-then-train rounds")
    parser.add_argument("--seed", type=int, default=0, help="task selection, sampling and trainer seed")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="trainer config override for both adapters, e.g. --set learning_rate=5e-4")
    parser.add_argument("--tasks", help="evaluate on this JSONL of {prefix, suffix, middle} records instead")
    parser.add_argument("--adapter", help="evaluate this existing adapter against the base model (no training)")
    parser.add_argument("--tune", action="store_true",
                        help="evaluate on held-out tasks of the training packages (for tuning), not the eval ones")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each request (as the demo)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (serving's default)")
    parser.add_argument("--stop", action="append", default=[], type=lambda text: codecs.decode(text, "unicode_escape"),
                        help="a stop string the client sends with each request (backslash escapes read, e.g. "
                             "'\\n'; repeatable; default none, as the simulated developers' sessions)")
    parser.add_argument("--pass-tokens", type=int, default=4096, help="token budget of one sampling pass")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TRAINER_CPU_THREADS", "1")),
                        help="torch CPU threads (default $TRAINER_CPU_THREADS or 1)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                        help="one more adapter trained on the same events, with these overrides on top of --set "
                             "(tuning; repeatable)")
    parser.add_argument("--skip-raw", action="store_true", help="train only the default variant (faster tuning)")
    parser.add_argument("--prefix-chars", type=int, default=500,
                        help="the most characters of the file before the cursor that a request carries (whole lines; "
                             "default 500, as the demo's editors send)")
    parser.add_argument("--no-expected", action="store_true",
                        help="skip the expected (computed) outcomes of the line developer")
    parser.add_argument("--out", help="keep adapters and events here (default: a temporary folder)")
    parser.add_argument("--no-gate", action="store_true",
                        help="no show filter: 'trained' is the adapter alone (learning_shared.show_filter)")
    parser.add_argument("--gate-recall", type=float, default=0.95,
                        help="the show filter's recall of accepted suggestions (the training policy's default 0.95)")
    parser.add_argument("--eval-each-round", action="store_true",
                        help="evaluate after every round, not only the last (figures for 1, 2, ... rounds)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from gpu_trainer.config import PPOConfig
    from learning_shared.errors import TrainerInputError

    torch.set_num_threads(max(1, args.threads))
    for name in ("train_tasks", "eval_tasks", "rounds"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1")
    try:
        overrides = parse_overrides(args.set)
        config = PPOConfig.from_dict({"seed": args.seed, "device": "cpu", "dtype": "float32", **overrides})
    except TrainerInputError as exc:
        raise SystemExit(f"error: {exc}") from None
    model_dir = resolve_model(args.model)
    adapter = Path(args.adapter) if args.adapter else None
    if adapter is not None and not adapter.is_dir():
        raise SystemExit(f"error: --adapter {adapter}: not a directory")

    if args.prefix_chars < 1:
        raise SystemExit("error: --prefix-chars must be >= 1")
    context = Context(max_prefix_chars=args.prefix_chars)
    started = time.monotonic()
    train_count = 0 if adapter is not None else args.train_tasks * args.rounds
    if args.tasks:
        eval_tasks = read_jsonl(args.tasks)
        train_tasks = load_tasks("train", train_count, seed=args.seed, context=context)
    elif args.tune:
        pool = load_tasks("train", train_count + args.eval_tasks, seed=args.seed, context=context)
        train_tasks, eval_tasks = pool[:train_count], pool[train_count:]
    else:
        train_tasks = load_tasks("train", train_count, seed=args.seed, context=context)
        eval_tasks = load_tasks("eval", args.eval_tasks, seed=args.seed, context=context)
    if not eval_tasks:
        raise SystemExit("error: no evaluation tasks")
    where = args.tasks or ("held-out tasks of the training packages" if args.tune else "the evaluation packages")
    print(f"model {model_dir.name}, population {args.population}, {len(eval_tasks)} eval tasks from {where}, "
          f"{args.train_tasks if adapter is None else 0} train events x {args.rounds if adapter is None else 0} "
          f"round(s), seed {args.seed}", flush=True)
    if overrides:
        print(f"trainer overrides: {json.dumps(overrides)}", flush=True)

    tokenizer = None if adapter is not None else load_tokenizer_of(model_dir)
    last_round = 0 if adapter is not None else args.rounds

    def emit(round_no: int, result: tuple[dict[str, Summary], dict[str, Expected], dict[str, dict[str, Any]]]) -> None:
        """A round's figures, printed as soon as it is evaluated; the last round's end the output."""
        summaries, expected, gates_fitted = result
        if round_no == last_round:
            print(f"\n{args.population} developers, {len(eval_tasks)} eval tasks "
                  f"({time.monotonic() - started:.0f} s in all):")
        if args.eval_each_round and adapter is None:
            print(f"\nafter round {round_no}:")
        report(summaries, expected, gates_fitted)
        print()
        values = {**figures(summaries, train_events=args.train_tasks * round_no), **expected_figures(expected),
                  **gate_figures(gates_fitted)}
        prefix = "" if round_no == last_round else f"round{round_no}_"
        for key, value in values.items():
            print(f"{prefix}{key}: {format_value(value)}", flush=True)

    with tempfile.TemporaryDirectory(prefix="strop-learning-") as tmp:
        work = Path(args.out) if args.out else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.out:
            print(f"adapters and events kept in {work}", flush=True)
        evaluation = Evaluation(model_dir, eval_tasks, args)
        if adapter is not None:
            emit(0, evaluation.run({"adapter": adapter}, {}))
        else:
            # The seed's variant: raw reward (no baseline) and no counterfactual silence. The trainer's
            # defaults leave silence to the show filter only where one is fitted, as the loop's runs do
            # (each round, below).
            defaults = config
            gate_decides_silence = not args.no_gate and "silence_gated" not in overrides
            own_silence: set[str] = set()  # variants that set silence_gated themselves
            variants = {"trained": defaults, "raw": config.replace(baseline="none", silence_counterfactual=False)}
            if args.skip_raw:
                del variants["raw"]
            for spec in args.variant:
                name, _, pairs = spec.partition(":")
                try:
                    variant_overrides = parse_overrides([p for p in pairs.split(",") if p])
                    variants[name] = defaults.replace(**variant_overrides)
                    if "silence_gated" in variant_overrides:
                        own_silence.add(name)
                except (TrainerInputError, TypeError) as exc:
                    raise SystemExit(f"error: --variant {spec}: {exc}") from None
            current: dict[str, Path | None] = {name: None for name in variants}
            window: dict[str, list[ShowEvent]] = {}  # each policy's last collected events, for its gate
            for round_no in range(1, args.rounds + 1):
                tasks = train_tasks[(round_no - 1) * args.train_tasks: round_no * args.train_tasks]
                collect_seed = args.seed * 1_000_003 + 7919 * round_no
                shared = None
                if all(parent is None for parent in current.values()):  # the base policy: one set of events
                    shared = run_policy(model_dir, None, tasks, args, seed=collect_seed,
                                        label=f"round {round_no}: collect (base)")
                # The raw variant is the comparison: it trains on the first round's events only.
                active = {name: v for name, v in variants.items() if round_no == 1 or name != "raw"}
                for name, variant in active.items():
                    served, requests, _ = shared or run_policy(model_dir, current[name], tasks, args, seed=collect_seed,
                                                            label=f"round {round_no}: collect ({name})")
                    window[name] = show_events(served, requests, tasks)
                    if shared is not None:
                        window["base"] = window[name]
                    samples = to_samples(served, requests, tokenizer)
                    (work / f"events-{name}-round{round_no}.jsonl").write_text(
                        "".join(json.dumps(s.to_dict()) + "\n" for s in samples))
                    print(f"round {round_no} {name} events: {summarise(requests)}", flush=True)
                    out_dir = work / f"{name}-round{round_no}"
                    if gate_decides_silence and name not in own_silence:
                        variant = variant.replace(silence_gated=fit_show_threshold(
                            window[name], recall=args.gate_recall) is not None)
                    current[name] = train(model_dir, samples, variant.replace(seed=args.seed + round_no - 1),
                                          out_dir, current[name], label=f"round {round_no} {name}")
                if round_no == args.rounds or args.eval_each_round:
                    gates = {} if args.no_gate else {name: window[name] for name in ("base", "trained")}
                    # the raw variant once: after its round, or with the others at the end
                    judged = [n for n in variants if n in active or (n == "raw" and not args.eval_each_round)]
                    emit(round_no, evaluation.run({n: current[n] for n in judged}, gates))
    return 0


class Evaluation:
    """The evaluation tasks served by each policy, with the same sampling seeds; the base model's
    once."""

    def __init__(self, model_dir: Path, tasks: Sequence[Task], args: argparse.Namespace) -> None:
        self.model_dir, self.tasks, self.args = model_dir, tasks, args
        self.seed = args.seed * 1_000_003 + 104_729
        self.base: tuple[list[Served], list[Request], Expected | None] | None = None
        # The last run's requests per reported name, in task order (for paired comparisons).
        self.requests: dict[str, list[Request]] = {}

    def serve(self, name: str, adapter_dir: Path | None) -> tuple[list[Served], list[Request], Expected | None]:
        if adapter_dir is None and self.base is not None:
            return self.base
        result = run_policy(self.model_dir, adapter_dir, self.tasks, self.args, seed=self.seed, label=f"eval ({name})",
                            expected=computes_expected(self.args))
        if adapter_dir is None:
            self.base = result
        return result

    def run(self, policies: dict[str, Path | None], windows: dict[str, list[ShowEvent]]
            ) -> tuple[dict[str, Summary], dict[str, Expected], dict[str, dict[str, Any]]]:
        """Each policy's figures; ``trained`` and ``base`` behind their show filters, fitted on their
        ``windows``, when there are any: the version (adapter + gate), then the parts."""
        summaries: dict[str, Summary] = {}
        expected: dict[str, Expected] = {}
        gated_summaries: dict[str, Summary] = {}
        gates: dict[str, dict[str, Any]] = {}
        served_requests: dict[str, list[Request]] = {}
        gated_requests: dict[str, list[Request]] = {}
        for name, adapter_dir in {"base": None, **policies}.items():
            served, requests, outcomes = self.serve(name, adapter_dir)
            summaries[name] = summarise(requests)
            served_requests[name] = requests
            if outcomes is not None:
                expected[name] = outcomes
            fitted = fit_show_threshold(windows[name], recall=self.args.gate_recall) if name in windows else None
            if name in windows:
                print(f"show filter for {name} (recall {self.args.gate_recall}, fitted on its last "
                      f"{len(windows[name])} shown events): {json.dumps(fitted)}", flush=True)
            if fitted is not None:
                threshold = float(fitted["threshold"])
                gated_requests[name] = gated(requests, served, threshold, self.args.population, self.tasks)
                gated_summaries[name] = summarise(gated_requests[name])
                # Its recall of what developers took, on code it has not seen, beside its window's.
                eval_recall = recall_of(show_events(served, requests, self.tasks), threshold)
                gates[name] = {**fitted, "eval_recall": round(eval_recall, 4)}
        if "trained" in gated_summaries:
            # What the loop produces is a version: the adapter and its show filter. The parts are reported too.
            summaries = {"base": summaries["base"], "trained": gated_summaries["trained"],
                         "adapter_only": summaries["trained"],
                         **({"gate_only": gated_summaries["base"]} if "base" in gated_summaries else {}),
                         **{k: v for k, v in summaries.items() if k not in ("base", "trained")}}
            if "trained" in expected:
                expected["adapter_only"] = expected.pop("trained")
            served_requests = {"base": served_requests["base"], "trained": gated_requests["trained"],
                               "adapter_only": served_requests["trained"],
                               **({"gate_only": gated_requests["base"]} if "base" in gated_requests else {}),
                               **{k: v for k, v in served_requests.items() if k not in ("base", "trained")}}
        self.requests = served_requests
        return summaries, expected, gates


def report(summaries: dict[str, Summary], expected: dict[str, Expected], gates: dict[str, dict[str, Any]]) -> None:
    for name, summary in summaries.items():
        print(describe(name, summary))
    for name, fitted in gates.items():
        print(f"show filter of {'the version' if name == 'trained' else 'the base model'}: recall of what developers "
              f"took {fitted['window_recall']} on its window, {fitted['check_recall']} on the window's held-out "
              f"files, {fitted['eval_recall']} on the evaluation tasks (fitted at {fitted['fit_recall']})")
    if expected:
        print("\nexpected outcomes (computed, not sampled: P(accepted) and P(silent) of every task, see expected.py):")
        for name, outcome in expected.items():
            values = outcome.figures()
            print(f"{name}: accept rate of shown {values['accept_rate']:.4f}, shown per request "
                  f"{values['shown_per_request']:.4f}, accepted per request {values['accepted_per_request']:.4f}, "
                  f"mean reward {values['mean_reward']:+.4f}")
        for name, outcome in expected.items():
            if name != "base":
                print(f"{name} - base, accepted per request (paired over the same tasks): "
                      f"{paired_difference(outcome.accept, expected['base'].accept)}")


def gate_figures(gates: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The show filters' recalls: the version's (``gate_…``) and the base model's (``gate_only_…``)."""
    out: dict[str, float] = {}
    for name, fitted in gates.items():
        prefix = "gate" if name == "trained" else "gate_only"
        for key in ("fit_recall", "window_recall", "check_recall", "eval_recall"):
            value = fitted[key]
            out[f"{prefix}_{key}"] = math.nan if value is None else float(value)
    return out

if __name__ == "__main__":
    sys.exit(main())
