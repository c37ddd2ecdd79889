"""The learning loop as a tenant sees it, over the API alone; `make demo` runs it.

Simulated developers (``benchmarks/simdev``, through the Python SDK) ask for completions at
cursors inside lines of real code (installed packages, not the standard library the starter
model learned from), accept a suggestion only when it is exactly the rest of the line they went
on to type, take silence as no suggestion at all, and send that feedback. Strop trains the tenant's adapter on it, the
gate checks the candidate, and an A/B experiment on the opted-in developers compares it with
production on packages held out from the first half; the demo acts on the experiment's decision
the way an admin would (promote, roll back, or keep production when the test is inconclusive).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx
from strop import Strop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from simdev import Summary, Task, load_tasks, run_session, summarise  # noqa: E402

POPULATION = "line"  # developers who take a suggestion only when it is exactly the rest of the line
DEVELOPERS = [f"dev-{i}" for i in range(8)]
# The experiment's cohort: enough users that the hash split gives both arms a few of them.
EXPERIMENT_USERS = [f"ab-dev-{i}" for i in range(24)]
EXPERIMENT_SECONDS = 60  # the shortest maximum duration; past it an undecided test is inconclusive


def work(client: Strop, tasks: list[Task], label: str) -> Summary:
    """Opted-in developers work through the tasks and send their feedback; the session's figures."""
    result = run_session(client, tasks, POPULATION, users=DEVELOPERS, concurrency=2, progress=label)
    return result.summary()


def production(version: int | None) -> str:
    return "the base model" if version is None else f"version {version}"


def experiment(http: httpx.Client, client: Strop, version: int, tasks: list[Task]) -> None:
    """Test the candidate against production on the opted-in cohort, then act on the decision."""
    created = http.post(
        "/v1/adapters/tab/experiments",
        json={
            "candidate_version": version,
            "candidate_weight": 0.5,
            "min_users_per_arm": 8,
            "max_duration_s": EXPERIMENT_SECONDS,
            "start": True,
        },
    )
    if created.status_code != 201:
        print(f"    the experiment could not start ({created.status_code}): {created.json()['error']['message']}")
        return
    exp = created.json()
    print(
        f"==> experiment {exp['id']}: version {version} against production ({production(exp['control_version'])}), "
        f"{len(EXPERIMENT_USERS)} opted-in developers split 50/50 by a hash of their id"
    )
    result = run_session(
        client, tasks, POPULATION, users=EXPERIMENT_USERS, concurrency=2, progress="developers at work (A/B)"
    )
    for arm_version in sorted({r.version for r in result.requests}):
        arm = summarise([r for r in result.requests if r.version == arm_version])
        print(f"    version {arm_version}: {describe(arm)}")
    decided, deadline = None, time.monotonic() + EXPERIMENT_SECONDS + 30
    while time.monotonic() < deadline:
        snap = http.post(f"/v1/experiments/{exp['id']}/snapshot")
        if snap.status_code != 200:  # ended by the system (inconclusive) between two looks
            decided = http.get(f"/v1/experiments/{exp['id']}").json()
            break
        body = snap.json()
        latest = body["latest"] or {}
        if body["status"] != "running" or latest.get("action") in ("promote", "rollback", "inconclusive"):
            decided = body
            break
        time.sleep(5)
    if decided is None:
        decided = http.post(f"/v1/experiments/{exp['id']}/stop", json={"reason": "demo budget spent"}).json()
    latest = decided.get("latest") or {}
    action = latest.get("action") or decided.get("decision") or "stopped"
    reason = ((latest.get("analysis") or {}).get("decision") or {}).get("reason") or decided.get("decision_reason", "")
    print(f"    decision: {action}: {reason}")
    if decided["status"] == "running" and action in ("promote", "rollback"):
        acted = http.post(f"/v1/experiments/{exp['id']}/{action}", json={"reason": "the experiment's decision"})
        acted.raise_for_status()
        decided = acted.json()
    adapter = next(a for a in http.get("/v1/adapters").json() if a["name"] == "tab")
    print(
        f"==> experiment {exp['id']} ended {decided['status']} ({decided.get('decision') or action}); "
        f"production is {production(adapter['production_version'])}"
    )


def describe(summary: Summary) -> str:
    rate = f"{summary.accept_rate.value:.0%}" if summary.shown else "none"
    return (
        f"accepted {summary.accepted} of {summary.shown} suggestions shown in {summary.requests} requests "
        f"(accept rate of shown {rate}, mean reward per request {summary.mean_reward.value:+.3f})"
    )


def latest_run_id(http: httpx.Client) -> int:
    runs = http.get("/v1/adapters/tab/training-runs").json()
    return runs[0]["id"] if runs else 0


def wait_for_run(http: httpx.Client, *, after_id: int, timeout_s: float) -> dict:
    started, last = time.monotonic(), None
    while time.monotonic() - started < timeout_s:
        runs = [r for r in http.get("/v1/adapters/tab/training-runs").json() if r["id"] > after_id]
        if runs:
            run = runs[-1]  # the oldest new one: the run this feedback started
            if run["status"] != last:
                print(f"  {time.monotonic() - started:6.1f} s  training run {run['id']}: {run['status']}")
                last = run["status"]
            if run["status"] in ("candidate", "rejected", "failed"):
                return run
        time.sleep(1)
    raise SystemExit(f"no training run finished within {timeout_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--events", type=int, default=128, help="labelled events that start a training run")
    args = parser.parse_args()
    http = httpx.Client(base_url=args.base, headers={"Authorization": f"Bearer {args.key}"}, timeout=120)
    client = Strop(base_url=args.base, api_key=args.key, timeout=120)

    policy = {"min_new_events": args.events, "heldout_fraction": 0.1}
    http.patch("/v1/adapters/tab/training-policy", json=policy).raise_for_status()
    print(f"==> training policy: a run starts after {args.events} new labelled events from opted-in developers")
    previous_run = latest_run_id(http)
    before = work(client, load_tasks("train", args.events), "developers at work (production)")
    print(f"    {describe(before)} from the production version")

    print("==> Strop trains the adapter (critic-free PPO on the feedback), then gates the candidate")
    run = wait_for_run(http, after_id=previous_run, timeout_s=900)
    stages = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in run["stage_seconds"].items())
    print(f"    {run['window_size']} events trained, {run['heldout_size']} held out; {stages}")
    gate = run["gate"]
    print(
        f"    gate: passed={gate.get('passed')}  KL to parent {gate.get('kl_to_parent')}  "
        f"off-policy reward {gate.get('reward_candidate')} vs parent {gate.get('reward_parent')}"
    )
    if run["status"] != "candidate":
        print(f"    the run ended {run['status']}: {run['error'][:500] or '; '.join(gate.get('reasons', []))}")
        return
    version = run["output_version"]
    experiment(http, client, version, load_tasks("eval", args.events))
    print(f"    before training: {describe(before)}")
    print("    (this feedback is enough for the next run: Strop keeps learning while the demo serves)")

if __name__ == "__main__":
    main()
