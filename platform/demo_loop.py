"""The learning loop as a tenant sees it, over the REST API alone; `make demo` runs it.

A simulated developer asks for fill-in-the-middle completions (code from the standard library),
accepts the ones close to the line they went on to type, and sends that feedback. Strop trains
the tenant's adapter on it, the gate checks the candidate, the demo promotes it the way an admin
would, and the same developer works on with the new version.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from common import feedback_items, fim_cases, serve_as_developers  # noqa: E402


def work(http: httpx.Client, cases: list[dict[str, str]], label: str) -> float:
    """Complete every case for opted-in developers, send the feedback, return the accept rate."""
    served = serve_as_developers(http, cases, workers=2, progress=label)
    http.post("/v1/feedback", json={"items": feedback_items(served)}).raise_for_status()
    return sum(ok for _, ok in served) / len(served)


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

    policy = {"min_new_events": args.events, "heldout_fraction": 0.1}
    http.patch("/v1/adapters/tab/training-policy", json=policy).raise_for_status()
    print(f"==> training policy: a run starts after {args.events} new labelled events from opted-in developers")
    previous_run = latest_run_id(http)
    before = work(http, fim_cases(args.events), "developers at work (production)")
    print(f"    accepted {before:.0%} of suggestions from the production version")

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
    after = work(http, fim_cases(args.events, start=args.events), f"developers at work (version {version})")
    print(
        f"    accepted {after:.0%} of suggestions from version {version} (before: {before:.0%}), "
        "on new code the model did not train on"
    )
    print("    (this feedback is enough for the next run: Strop keeps learning while the demo serves)")


if __name__ == "__main__":
    main()
