"""Test a candidate adapter version against production on your opted-in users: list the
candidates, create and start an experiment, see which arm a few users get, read its results,
and stop it (production stays as it was).

    STROP_BASE_URL=http://127.0.0.1:8000 STROP_API_KEY=strop_... python sdk/examples/manage_an_experiment.py [ADAPTER]

The key needs the ``admin`` scope (and ``serve`` or ``ingest`` for the assignments). ADAPTER
defaults to the tenant's default adapter; it needs a version that passed the gate (``candidate``).
"""

from __future__ import annotations

import sys

from strop import Strop


def production(version: int | None) -> str:
    return "the base model" if version is None else f"version {version}"


def main(argv: list[str]) -> int:
    with Strop() as client:  # STROP_BASE_URL and STROP_API_KEY
        adapters = client.adapters.list()
        adapter = next((a for a in adapters if a.name == argv[0]), None) if argv else None
        adapter = adapter or next((a for a in adapters if a.is_default), None)
        if adapter is None:
            print(f"no adapter {argv[0] if argv else '(default)'}: the tenant has {[a.name for a in adapters]}")
            return 1
        print(f"adapter {adapter.name}: production is {production(adapter.production_version)}")

        candidates = [v for v in client.adapters.versions.list(adapter.name) if v.status == "candidate"]
        for version in candidates:
            print(f"  candidate: version {version.number} (from {production(version.parent)}), {version.vllm_name}")
        if not candidates:
            print("no candidate version: a training run whose candidate passes the gate makes one")
            return 1
        candidate = max(candidates, key=lambda version: version.number)

        # A small cohort should say so: the always-valid interval is tuned to expected_users.
        experiment = client.experiments.create(
            adapter.name,
            candidate_version=candidate.number,
            candidate_weight=0.5,
            expected_users=200,
            guardrails=["accepted_per_request", "error_rate"],
        )
        print(f"created experiment {experiment.id}: {experiment.status}")
        experiment = client.experiments.start(experiment.id)
        print(
            f"started experiment {experiment.id}: {experiment.status}, control {production(experiment.control_version)}"
        )

        # Serving elsewhere? Ask which arm each user gets (the exposure is recorded).
        for user in ("example-user-1", "example-user-2", "example-user-3", "example-user-4"):
            assignment = client.experiments.assignment(adapter.name, user, opted_in=True)
            print(f"  {user}: {assignment.arm} arm, serve {assignment.model}")

        experiment = client.experiments.snapshot(experiment.id)  # the statistics, computed now
        latest = experiment.latest
        if latest is not None:
            reason = (latest.analysis or {}).get("decision", {}).get("reason", "")
            print(f"results: {latest.users} users, the experiment says {latest.action}: {reason}")
        print(f"snapshots so far: {len(client.experiments.snapshots(experiment.id))}")

        experiment = client.experiments.stop(experiment.id, reason="the example is done")
        now = client.adapters.get(adapter.name).production_version
        print(f"stopped experiment {experiment.id}: {experiment.status}; production is {production(now)}")
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
