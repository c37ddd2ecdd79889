"""The learning loop as tenants see it, over the API alone (every call through the Python SDK);
`make demo` runs it.

Each tenant has its own simulated developers (``benchmarks/simdev``):
they ask for completions at cursors inside lines of real code (installed packages the base
model was not tuned on), take an empty suggestion as nothing shown, and accept a shown one only
by their population's rule ("line": exactly the rest of the line; "block": the right next lines).
(They take every suggestion the rule accepts: with a propensity of their own, ``simdev.traits``, a
round's window held about 8 accepted suggestions, under the 10 the show filter needs, and the
version learned nothing.) A round's developers work on production first, so a share of its A/B
users carry history from before it.
Their feedback trains the tenant's adapter; the gate checks the candidate; an A/B experiment on
the opted-in developers compares it with production on packages held out from training; the demo
acts on the experiment's decision the way an admin would (promote, roll back, or keep production
when the test has not decided). Rounds repeat while they fit in the budget. It ends with a report
(text and a PNG chart) under ``--report``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strop import APIStatusError, Metric, Strop, TrainingRun

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
from simdev import Context, SessionResult, Summary, Task, load_tasks, run_session  # noqa: E402

from demo.report import Row, write_report  # noqa: E402

ADAPTER = "tab"
# The experiment's cohort arrives in waves of new opted-in developers, each making a few requests;
# Strop's always-valid statistics may be read after every wave, and the demo acts as soon as they
# decide, after the last wave, or when the budget leaves no time for another (a later tenant's
# experiment keeps time of its own). Its interval is tuned to the whole cohort (expected_users).
# What a first round learns is small beside the noise of four requests a developer, so the demo
# serves as many waves as its budget allows, with adapters served as fast as the base model
# (platform/vllm_plugins/strop_vllm_cpu_lora.py) and a few requests in flight; the measured lifts
# and cohort sizes are in benchmarks/results-log.md and docs/performance.md, not here.
WAVE_USERS = 12
WAVES = 24
CONCURRENCY = 4  # requests a tenant's developers have in flight; vLLM batches them
EXPERIMENT_USERS = WAVE_USERS * WAVES
# The default guardrails but latency: here the control is the base model alone, and vLLM's CPU
# build serves any LoRA adapter slower than that, whatever it learned, so the latency guardrail
# rolled candidates back for their serving path, not for what they learned (the measurements are
# in benchmarks/results-log.md). On a GPU the LoRA path costs little and the latency guardrail
# belongs on, as it is by default.
GUARDRAILS: list[Metric] = ["accepted_per_request", "error_rate", "dissatisfied_rate"]
RUN_TIMEOUT_S = 1800
# Tasks carry a short window of the file, so that serving and training on CPU stay quick.
CONTEXT = Context(max_prefix_lines=12, max_prefix_chars=500, suffix_lines=2, max_typed_chars=300, max_suffix_chars=300)
# What each population's editor asks for: a single-line client stops at the end of the line; a
# block client at a blank line, with room for a few lines.
REQUEST = {"line": {"stop": ["\n"], "max_tokens": 24}, "block": {"stop": ["\n\n"], "max_tokens": 48}}


@dataclass
class Tenant:
    slug: str
    key: str
    population: str
    base: str
    events: int
    client: Strop = field(init=False)
    run_after: int = 0
    rows: list[Row] = field(default_factory=list)
    experiments: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = Strop(base_url=self.base, api_key=self.key, timeout=300)

    def users(self, prefix: str, count: int) -> list[str]:
        return [f"{self.slug}-{prefix}-{i}" for i in range(count)]

    def cohort(self, round_no: int) -> list[str]:
        """The round's developers: on production first (training the round's run), then in its
        A/B waves with that history; each wave's first ones first, so waves share it evenly."""
        waves = [self.users(f"ab{round_no}w{wave}", WAVE_USERS) for wave in range(WAVES)]
        return [wave[i] for i in range(WAVE_USERS) for wave in waves]


def describe(summary: Summary) -> str:
    rate = f"{summary.accept_rate.value:.0%}" if summary.shown else "none"
    return (
        f"accepted {summary.accepted} of {summary.shown} suggestions shown in {summary.requests} requests "
        f"(accept rate of shown {rate}, mean reward per request {summary.mean_reward.value:+.3f})"
    )


def production(version: int | None) -> str:
    return "the base model" if version is None else f"version {version}"


def production_version(tenant: Tenant) -> int | None:
    return tenant.client.adapters.get(ADAPTER).production_version


def set_min_events(tenant: Tenant, count: int) -> None:
    tenant.client.training_policy.update(ADAPTER, min_new_events=count)


def latest_run_id(tenant: Tenant) -> int:
    return max((run.id for run in tenant.client.training_runs.list(ADAPTER)), default=0)


def serve(tenant: Tenant, tasks: list[Task], round_no: int) -> None:
    """The tenant's developers work with production and send feedback; that starts a run."""
    tenant.run_after = latest_run_id(tenant)
    label = f"{tenant.slug}: developers at work ({production(production_version(tenant))})"
    result = run_session(
        tenant.client,
        tasks,
        tenant.population,
        users=tenant.cohort(round_no),
        concurrency=CONCURRENCY,
        seed=round_no * 100_000,
        progress=label,
        **REQUEST[tenant.population],
    )
    summary = result.summary()
    tenant.rows.append(Row(tenant.slug, round_no, "production", production(production_version(tenant)), summary))
    print(f"    {tenant.slug}: {describe(summary)}")


FINISHED = ("candidate", "rejected", "failed")


def ask_for_run(tenant: Tenant) -> None:
    """Each round trains on its own feedback, and asks for its run when that feedback did not start
    one: the threshold counts labelled events that train, and the suggestions a version's show filter
    withholds are not among them, so a round's requests can fall short of it. A run still going from
    before the round finishes first (the round's run would wait behind it anyway)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    announced = False
    while time.monotonic() < deadline:
        runs = tenant.client.training_runs.list(ADAPTER)
        if any(run.id > tenant.run_after for run in runs):
            return  # this round's feedback started it
        earlier = [run for run in runs if run.status not in FINISHED]
        if earlier:
            if not announced:
                print(f"    {tenant.slug}: run {earlier[0].id} from before this round finishes first")
                announced = True
            time.sleep(2)
            continue
        try:
            run = tenant.client.training_runs.start(ADAPTER)
        except APIStatusError as exc:
            if exc.status_code == 409:  # one started meanwhile
                time.sleep(2)
                continue
            raise
        print(f"    {tenant.slug}: its feedback did not reach the threshold; the round asked for run {run.id}")
        tenant.run_after = run.id - 1
        return


def wait_for_run(tenant: Tenant) -> TrainingRun | None:
    started, last = time.monotonic(), None
    while time.monotonic() - started < RUN_TIMEOUT_S:
        runs = [r for r in tenant.client.training_runs.list(ADAPTER) if r.id > tenant.run_after]
        if runs:
            run = min(runs, key=lambda r: r.id)  # the run this round's feedback started (or asked for)
            if run.status != last:
                waited = time.monotonic() - started
                print(f"  {waited:6.1f} s  {tenant.slug}: training run {run.id}: {run.status}")
                last = run.status
            if run.status in ("candidate", "rejected", "failed"):
                return run
        time.sleep(2)
    print(f"    {tenant.slug}: no training run finished within {RUN_TIMEOUT_S} s")
    return None


def report_run(tenant: Tenant, run: TrainingRun) -> None:
    stages = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in (run.stage_seconds or {}).items())
    print(f"    {tenant.slug}: {run.window_size} events trained, {run.heldout_size} held out; {stages}")
    gate = run.gate or {}
    kl = gate.get("kl_to_parent")
    kl_text = f", KL to parent {kl:.3g}" if isinstance(kl, float) else ""
    print(f"    {tenant.slug}: gate passed={gate.get('passed')}{kl_text}")
    if run.status != "candidate":
        why = (run.error or "")[:500] or "; ".join(gate.get("reasons", []))
        print(f"    {tenant.slug}: the run ended {run.status}: {why}")


def experiment(
    tenant: Tenant, version: int, tasks: list[Task], round_no: int, *, dashboard: str = "", deadline: float = 0.0
) -> bool:
    """Test the candidate against production on the opted-in cohort, wave by wave, then act on the
    decision (or, with ``dashboard``, leave it to the admin on the experiment's page). The first
    wave always runs; a later one starts only if it would end by ``deadline`` (monotonic seconds; 0:
    none), taking as long as the longest wave so far."""
    try:
        exp = tenant.client.experiments.create(
            ADAPTER,
            candidate_version=version,
            candidate_weight=0.5,
            min_users_per_arm=8,
            expected_users=max(2, min(EXPERIMENT_USERS, len(tasks))),
            guardrails=GUARDRAILS,
            start=True,
        )
    except APIStatusError as exc:
        answer = exc.response.text if exc.response is not None else exc.message
        print(f"    {tenant.slug}: the experiment could not start ({exc.status_code}): {answer[:300]}")
        return False
    # The experiment's feedback trains the next round (with that round's own), not a run of its own
    # that would start from today's production while the experiment is still deciding: no run
    # starts until both are in.
    set_min_events(tenant, 1_000_000)
    control = production(exp.control_version)
    per_wave = -(-len(tasks) // WAVES)  # the last wave takes what is left
    print(
        f"==> {tenant.slug}: experiment {exp.id}, version {version} against production ({control}), on held-out "
        f"packages: up to {WAVES} waves of {WAVE_USERS} new opted-in developers ({per_wave} requests a wave), "
        "split 50/50 by a hash of their id; the statistics are read after every wave"
    )
    requests: list[Any] = []
    action, reason, decided = "keep_running", "", exp
    wave_s = 0.0
    for wave in range(WAVES):
        wave_tasks = tasks[wave * per_wave : (wave + 1) * per_wave]
        if not wave_tasks:
            break
        if wave and deadline and time.monotonic() + wave_s > deadline:
            print(f"    {tenant.slug}: the demo's budget leaves no time for wave {wave + 1}")
            break
        wave_started = time.monotonic()
        result = run_session(
            tenant.client,
            wave_tasks,
            tenant.population,
            users=tenant.users(f"ab{round_no}w{wave}", WAVE_USERS),
            concurrency=CONCURRENCY,
            seed=round_no * 100_000 + 50_000 + wave * per_wave,
            progress=f"{tenant.slug}: A/B experiment, wave {wave + 1} of {WAVES}",
            **REQUEST[tenant.population],
        )
        wave_s = max(wave_s, time.monotonic() - wave_started)
        requests += result.requests
        try:
            decided = tenant.client.experiments.snapshot(exp.id)
        except APIStatusError:  # no longer running (it acted on its own decision): read it as it is
            decided = tenant.client.experiments.get(exp.id)
        latest = decided.latest
        analysis = (latest.analysis if latest is not None else None) or {}
        action = (latest.action if latest is not None else None) or decided.decision or "keep_running"
        reason = (analysis.get("decision") or {}).get("reason") or decided.decision_reason or ""
        users = latest.users if latest is not None else "?"
        print(f"    {tenant.slug}: after wave {wave + 1} ({users} users): {action}")
        if action in ("promote", "rollback"):
            break
    result = SessionResult(population=tenant.population, requests=requests)
    for served, summary in result.by_version().items():
        candidate = served.startswith(f"{tenant.slug}--{ADAPTER}--v{version}-")
        label = f"version {version}" if candidate else control
        tenant.rows.append(Row(tenant.slug, round_no, "A/B candidate" if candidate else "A/B control", label, summary))
        print(f"    {tenant.slug}: {label}: {describe(summary)}")
    print(f"    {tenant.slug}: the experiment says {action}: {reason}")
    left = decided.status == "running" and bool(dashboard)
    if left:
        page = f"{dashboard}t/{tenant.slug}/experiments/{exp.id}/"
        print(f"==> {tenant.slug}: experiment {exp.id} is left running for you: act on it at {page}")
        status, now = "running (yours to decide on the dashboard)", control
    else:
        if decided.status == "running":
            experiments = tenant.client.experiments
            if action == "promote":
                decided = experiments.promote(exp.id, reason="the experiment's decision")
            elif action == "rollback":
                decided = experiments.rollback(exp.id, reason="the experiment's decision")
            else:  # not decided within the demo: production stays, as an admin with no more time would leave it
                decided = experiments.stop(exp.id, reason="demo budget spent before a decision")
        status, now = decided.status, production(production_version(tenant))
        print(f"==> {tenant.slug}: experiment {exp.id} ended {status}; production is {now}")
    set_min_events(tenant, tenant.events + len(requests))
    tenant.experiments.append(
        {
            "tenant": tenant.slug,
            "round": round_no,
            "id": exp.id,
            "candidate": version,
            "control": control,
            "action": action,
            "reason": reason,
            "status": status,
            "production_after": now,
        }
    )
    return left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True)
    parser.add_argument(
        "--tenant",
        action="append",
        required=True,
        metavar="SLUG:KEY:POPULATION",
        help="a tenant, its admin key and its developers' population (line or block); repeatable",
    )
    parser.add_argument("--events", type=int, default=128, help="labelled events per round, per tenant")
    parser.add_argument(
        "--experiment-requests",
        type=int,
        default=4 * WAVE_USERS * WAVES,
        help=f"requests of each A/B experiment at most, in {WAVES} waves",
    )
    parser.add_argument("--budget-min", type=float, default=20.0, help="start another round only if it fits")
    parser.add_argument("--rounds", type=int, default=2, help="at most this many rounds")
    parser.add_argument("--trainer", default="{}", help="JSON trainer overrides for the training policy")
    parser.add_argument("--report", default="var/demo", help="folder for report.txt and report.png")
    parser.add_argument(
        "--context-chars",
        type=int,
        default=CONTEXT.max_prefix_chars,
        help="the most characters of the file before the cursor a request sends (a base model's context fits it)",
    )
    parser.add_argument("--dashboard", default="", help="where the dashboard is, for the report")
    parser.add_argument(
        "--leave-last",
        default="",
        metavar="DASHBOARD_URL",
        help="leave the last round's experiments running, for the admin to decide on this dashboard",
    )
    args = parser.parse_args()
    context = dataclasses.replace(CONTEXT, max_prefix_chars=args.context_chars)
    started = time.monotonic()
    tenants = []
    for spec in args.tenant:
        slug, key, population = spec.split(":")
        tenants.append(Tenant(slug, key, population, args.base, args.events))
    trainer = json.loads(args.trainer)
    for t in tenants:
        t.client.training_policy.update(
            ADAPTER, min_new_events=args.events, heldout_fraction=0.1, trainer_overrides=trainer
        )
    print(
        f"==> {len(tenants)} tenants; a training run starts after {args.events} new labelled events from opted-in "
        f"developers; at most {args.rounds} rounds within {args.budget_min:g} minutes"
    )
    round_s = 0.0
    for round_no in range(1, args.rounds + 1):
        elapsed = time.monotonic() - started
        # A later round trains on more events (the experiment's feedback too): allow for a longer one.
        if round_no > 1 and elapsed + 1.5 * round_s > args.budget_min * 60:
            print(f"==> round {round_no} would not fit in the budget ({elapsed / 60:.1f} of {args.budget_min:g} min)")
            break
        round_started = time.monotonic()
        print(f"\n==> round {round_no}: developers work on training packages; each tenant's feedback starts a run")
        for i, t in enumerate(tenants):
            serve(t, load_tasks("train", args.events, seed=round_no * 10 + i, context=context), round_no)
        print(f"==> round {round_no}: Strop trains each adapter (critic-free PPO on its feedback) and gates it")
        for t in tenants:
            ask_for_run(t)
        left = False
        for i, t in enumerate(tenants):
            run = wait_for_run(t)
            if run is None:
                continue
            report_run(t, run)
            if run.status == "candidate" and run.output_version is not None:
                tasks = load_tasks("eval", args.experiment_requests, seed=round_no * 10 + i, context=context)
                now = time.monotonic()  # a next round takes longer than this one has so far
                last = round_no == args.rounds or (now - started) + (now - round_started) > args.budget_min * 60
                # Waves end a minute before the budget (the report), and 3 minutes earlier for each
                # tenant after this one: it still tests its own.
                deadline = started + args.budget_min * 60 - 60 * (1 + 3 * (len(tenants) - 1 - i))
                left |= experiment(
                    t,
                    run.output_version,
                    tasks,
                    round_no,
                    dashboard=args.leave_last if last else "",
                    deadline=deadline,
                )
        round_s = time.monotonic() - round_started
        if left:  # the admin decides the rest on the dashboard
            break
    write_report(
        [row for t in tenants for row in t.rows],
        [e for t in tenants for e in t.experiments],
        Path(args.report),
        time.monotonic() - started,
        args.dashboard,
    )


if __name__ == "__main__":
    main()
