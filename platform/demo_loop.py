"""The learning loop as a tenant sees it, over the API alone; `make demo` runs it.

Simulated developers (``benchmarks/simdev``, through the Python SDK) ask for completions at
cursors inside lines of real code (installed packages, not the standard library the starter
model learned from), accept a suggestion only when it is exactly the rest of the line they went
on to type, take silence as no suggestion at all, and send that feedback. Strop trains the tenant's adapter on it, the
gate checks the candidate, the demo promotes it the way an admin would, and the developers work
on with the new version, on packages held out from the first half.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx
from strop import Strop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from simdev import Summary, Task, load_tasks, run_session  # noqa: E402

POPULATION = "line"  # developers who take a suggestion only when it is exactly the rest of the line
DEVELOPERS = [f"dev-{i}" for i in range(8)]


def work(client: Strop, tasks: list[Task], label: str) -> Summary:
    """Opted-in developers work through the tasks and send their feedback; the session's figures."""
    result = run_session(client, tasks, POPULATION, users=DEVELOPERS, concurrency=2, progress=label)
    return result.summary()


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
    promoted = http.post(f"/v1/adapters/tab/versions/{version}/promote")
    if promoted.status_code != 200:
        print(f"    promotion refused ({promoted.status_code}): {promoted.json()['error']['message']}")
        return
    print(f"==> version {version} promoted to production (the A/B gate comes with experiments)")
    after = work(client, load_tasks("eval", args.events), f"developers at work (version {version})")
    print(f"    {describe(after)} from version {version}, on packages held out from training")
    print(f"    before: {describe(before)}")
    print("    (this feedback is enough for the next run: Strop keeps learning while the demo serves)")


if __name__ == "__main__":
    main()
