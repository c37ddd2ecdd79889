"""Experiments: does watching the page at every peek keep its error rate, and how fast is a snapshot?

Peeking simulation (no database): ``--experiments`` simulated A/B experiments of ``--users``
users each (assigned 50/50 at random, users that look like the product), looked at after every
``--users / --peeks`` users with the always-valid inference of ``apps.experiments.stats``.

- false_positive_rate: share of experiments with no true difference that were ever declared
  significant on the primary metric (mean reward per request); should be ≤ alpha.
- false_positive_rate_fixed_horizon_peeking: the same peeks with fixed-horizon intervals.
- detection_rate: share of experiments with a true relative lift of ``--lift`` in reward per
  request (the accept rate of shown suggestions rising as printed) ever declared better.
- pre_post_correlation: over users with history, the correlation of reward per request in the
  pre-exposure window and in the experiment, in the demo's population (``experiments_demo``: the
  simulated developers' own propensity, 44 % of the cohort with one production request before
  exposure, 4 requests in the experiment); ``pre_post_correlation_demo_as_run`` measures it with
  the demo's fixed request counts, the headline with the simulation's geometric ones.
- fpr_peeking_adjusted: as false_positive_rate, deciding on the lift adjusted by that history.
- users_to_decision_ratio: median users (both arms) to the first look declared better, adjusted ÷
  unadjusted, true lift ``--demo-lift`` of the accept rate, looking every ``--decision-step`` users.
- the same with better covariates, a longer pre-period (every user with 20 or 200 production
  requests before exposure: ``..._pre_requests_20``, ``..._pre_requests_200``); in the earlier
  product model (``simulate.History``: activity and accept probability carried over, 80 % with
  history, true lift ``--lift`` of reward per request: ``..._product_model``); and for users far
  more different from one another (Beta κ = 2, lift 2 × ``--lift``: ``..._heterogeneous_users``).
- snapshot_seconds_100k_users_stats_only: median time of ``analyze()`` on 100,000 users in all,
  from per-user sums already in memory.

    python benchmarks/experiments.py --experiments 400 --users 5000 --peeks 20 --seed 0
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta

import numpy as np
from common import ROOT

sys.path.insert(0, str(ROOT))

SNAPSHOT_USERS = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=400, help="simulated experiments per scenario")
    parser.add_argument("--users", type=int, default=5000, help="users per experiment, both arms together")
    parser.add_argument("--peeks", type=int, default=20, help="looks at the page per experiment")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lift", type=float, default=0.6, help="true relative lift of reward per request")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--n-star", type=float, default=5000.0, help="tuning sample size of the confidence sequence")
    parser.add_argument("--decision-step", type=int, default=25, help="users between looks, for users to a decision")
    parser.add_argument(
        "--demo-lift", type=float, default=1.0, help="true relative lift of the accept rate, in the demo's population"
    )
    args = parser.parse_args()

    from apps.experiments.stats.simulate import UserBehaviour, peeking_simulation

    rng = np.random.default_rng(args.seed)
    control = UserBehaviour()
    candidate = control.with_reward_lift(args.lift)
    scenario = {
        "experiments": args.experiments,
        "users": args.users,
        "peeks": args.peeks,
        "alpha": args.alpha,
        "n_star": args.n_star,
    }
    null = peeking_simulation(control, control, rng=rng, **scenario)
    lifted = peeking_simulation(control, candidate, rng=rng, **scenario)

    print(f"alpha: {args.alpha}")
    print(f"experiments: {args.experiments}")
    print(f"users: {args.users}")
    print(f"peeks: {args.peeks}")
    print(f"n_star: {args.n_star:g}")
    print(f"seed: {args.seed}")
    print(f"false_positive_rate: {null.ever_significant.mean():.4f}")
    print(f"false_positive_rate_fixed_horizon_peeking: {null.ever_significant_fixed.mean():.4f}")
    print(f"true_relative_lift: {args.lift}")
    print(f"accept_rate_control: {control.accept_rate:.4f}")
    print(f"accept_rate_candidate: {candidate.accept_rate:.4f}")
    print(f"detection_rate: {lifted.ever_better.mean():.4f}")
    adjusted_figures(args, scenario)
    print(f"snapshot_seconds_100k_users_stats_only: {snapshot_seconds_stats_only(SNAPSHOT_USERS, args.seed):.4f}")
    db_seconds = snapshot_seconds_db_aggregation(SNAPSHOT_USERS, args.seed)
    if db_seconds is not None:
        print(f"snapshot_seconds_100k_exposures: {db_seconds:.4f}  # aggregate in Postgres + analyse + store")


def adjusted_figures(args: argparse.Namespace, scenario: dict) -> None:
    """Variance reduction by the users' pre-exposure behaviour: its error rate and what it saves,
    first in the demo's population (the headline figures), then with longer pre-periods and in
    the earlier product model."""
    import dataclasses

    from experiments_demo import demo_behaviour, demo_correlation

    from apps.experiments.stats.simulate import (
        History,
        UserBehaviour,
        peeking_simulation,
        pre_post_correlation,
        simulate_users_with_history,
    )

    rng = np.random.default_rng(args.seed + 1)
    print(f"pre_post_correlation_demo_as_run: {demo_correlation(rng):.3f}  # fixed counts, as demo/loop.py")
    product = UserBehaviour()
    heterogeneous = dataclasses.replace(product, accept_concentration=2.0)
    scenarios = (
        # label, (behaviour, history), candidate
        ("", demo_behaviour(), lambda b: b.with_accept_lift(args.demo_lift)),
        ("_pre_requests_20", demo_behaviour(20.0), lambda b: b.with_accept_lift(args.demo_lift)),
        ("_pre_requests_200", demo_behaviour(200.0), lambda b: b.with_accept_lift(args.demo_lift)),
        ("_product_model", (product, History()), lambda b: b.with_reward_lift(args.lift)),
        # Users this different need a larger lift to decide within --users at all.
        ("_heterogeneous_users", (heterogeneous, History()), lambda b: b.with_reward_lift(2 * args.lift)),
    )
    for label, (control, history), lifted_behaviour in scenarios:
        pre, (during,) = simulate_users_with_history(control, (control,), history, 100_000, rng)
        print(f"pre_post_correlation{label}: {pre_post_correlation(pre, during):.3f}")
        if label in ("", "_product_model"):
            null = peeking_simulation(control, control, rng=rng, history=history, **scenario)
            print(f"false_positive_rate_unadjusted_with_history{label}: {null.ever_significant.mean():.4f}")
            print(f"fpr_peeking_adjusted{label}: {null.ever_significant_adjusted.mean():.4f}")
        looks = dict(scenario, peeks=max(1, args.users // args.decision_step))
        lifted = peeking_simulation(control, lifted_behaviour(control), rng=rng, history=history, **looks)
        assert lifted.users_to_better is not None and lifted.users_to_better_adjusted is not None
        unadjusted = float(np.median(lifted.users_to_better))
        adjusted = float(np.median(lifted.users_to_better_adjusted))
        print(f"users_to_decision_median_unadjusted{label}: {unadjusted:.0f}")
        print(f"users_to_decision_median_adjusted{label}: {adjusted:.0f}")
        print(f"users_to_decision_ratio{label}: {adjusted / unadjusted:.3f}")


def snapshot_seconds_stats_only(users: int, seed: int, repeats: int = 5) -> float:
    """Median seconds of ``analyze()`` on ``users`` simulated users (both arms), data in memory."""
    from apps.experiments.stats import analyze
    from apps.experiments.stats.simulate import UserBehaviour, simulate_experiment

    behaviour = UserBehaviour()
    control, candidate = simulate_experiment(behaviour, behaviour, users=users, rng=np.random.default_rng(seed))
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        analyze(control, candidate, elapsed=timedelta(days=7))
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def snapshot_seconds_db_aggregation(users: int, seed: int) -> float | None:
    """Seconds of a whole snapshot (aggregate in Postgres, analyse, store) of an experiment with
    ``users`` exposures and two requests each, in a fresh database. None without one to use."""
    import os
    import random

    from common import DEFAULT_DATABASE_URL, fresh_database, setup_django

    base_url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    if not base_url.startswith("postgres"):
        return None
    setup_django(fresh_database(base_url, "strop_bench_experiments"))
    from django.utils import timezone

    from apps.adapters.models import Adapter, AdapterVersion, BaseModel
    from apps.cohorts.models import EndUser
    from apps.experiments.models import Experiment, ExperimentExposure
    from apps.experiments.services import experiment_snapshot_take
    from apps.interactions.ids import time_id
    from apps.interactions.models import Feedback, Interaction
    from apps.tenants.services import tenant_create

    rng = random.Random(seed)
    now = timezone.now()
    tenant = tenant_create(name="Bench", slug="bench")
    base = BaseModel.objects.create(name="bench-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    candidate = AdapterVersion.objects.create(
        tenant=tenant,
        adapter=adapter,
        number=1,
        artifact_path="/nonexistent/v1",
        vllm_name="bench--tab--v1",
        status="in_experiment",
    )
    experiment = Experiment.objects.create(
        tenant=tenant,
        adapter=adapter,
        candidate_version=candidate,
        salt="bench",
        status="running",
        started_at=now,
        created_by="bench",
    )
    batch = 5000
    for start in range(0, users, batch):
        chunk = range(start, min(users, start + batch))
        created = EndUser.objects.bulk_create(
            [EndUser(tenant=tenant, external_id=f"u{n}", opted_in=True) for n in chunk]
        )
        arms = {user.pk: ("candidate" if rng.random() < 0.5 else "control") for user in created}
        ExperimentExposure.objects.bulk_create(
            [
                ExperimentExposure(  # as serving records them: history frozen at exposure (none here)
                    tenant=tenant,
                    experiment=experiment,
                    end_user=user,
                    arm=arms[user.pk],
                    first_exposed_at=now,
                    history_requests=0,
                    history_shown=0,
                    history_accepted=0,
                    history_reward=0.0,
                    history_frozen_at=now,
                )
                for user in created
            ]
        )
        interactions = []
        for user in created:
            for _ in range(2):
                interactions.append(
                    Interaction(
                        id=time_id(now),
                        tenant=tenant,
                        source="served",
                        prompt="p",
                        completion="c" if rng.random() < 0.9 else "",
                        adapter=adapter,
                        adapter_version=candidate if arms[user.pk] == "candidate" else None,
                        experiment=experiment,
                        experiment_arm=arms[user.pk],
                        end_user_id=user.external_id,
                        end_user_opted_in=True,
                        served_at=now,
                        received_at=now,
                        latency_ms=rng.uniform(20, 200),
                    )
                )
        Interaction.objects.bulk_create(interactions)
        outcomes = ("accepted", "rejected", "not_shown")
        Feedback.objects.bulk_create(
            [
                Feedback(
                    tenant=tenant,
                    interaction=i,
                    outcome=rng.choice(outcomes),
                    occurred_at=now,
                    received_at=now,
                    updated_at=now,
                )
                for i in interactions
            ]
        )
    started = time.perf_counter()
    snapshot = experiment_snapshot_take(experiment.pk)
    seconds = time.perf_counter() - started
    assert snapshot is not None and snapshot.users == users
    return seconds


if __name__ == "__main__":
    main()
