"""Each simulated developer's own propensity: persistent, spread as documented, and only ever
turning an accept into a reject."""

from __future__ import annotations

import statistics

from benchmarks.simdev import Decision, propensity, with_propensity


def test_a_developers_propensity_is_their_own_and_the_same_every_time() -> None:
    assert propensity("demo-ab1w0-3") == propensity("demo-ab1w0-3")
    values = [propensity(f"dev-{n}") for n in range(4000)]
    assert len(set(values)) == len(values)
    # Beta(4, 1.5): mean 0.727, standard deviation 0.175 (seeded ids: the same figures every run).
    assert abs(statistics.mean(values) - 0.727) < 0.015
    assert abs(statistics.stdev(values) - 0.175) < 0.015


def test_only_accepts_change_and_a_high_propensity_takes_more() -> None:
    for outcome in ("rejected", "not_shown", "partial", "edited"):
        decision = Decision(outcome)  # type: ignore[arg-type]
        assert with_propensity(decision, user="dev-1", request_key="t") is decision
    users = sorted((f"dev-{n}" for n in range(200)), key=propensity)
    low, high = users[:20], users[-20:]

    def taken(group: list[str]) -> int:
        accepted = Decision("accepted")
        return sum(
            with_propensity(accepted, user=u, request_key=str(k)).outcome == "accepted"
            for u in group
            for k in range(50)
        )

    assert taken(high) > taken(low) + 300  # of 1,000 accepts each: about 930 against 400


def test_the_experiments_benchmark_simulates_the_demos_population_with_the_same_spread() -> None:
    import numpy as np

    from benchmarks.experiments_demo import COHORT, PRE_REQUESTS_TOTAL, RULE_ACCEPT, demo_behaviour, demo_correlation

    behaviour, history = demo_behaviour()
    assert behaviour.accept_rate == RULE_ACCEPT * 4.0 / 5.5  # the rule's rate × the mean propensity
    kappa, p = behaviour.accept_concentration, behaviour.accept_rate
    spread = np.sqrt(p * (1 - p) / (kappa + 1))  # the Beta's standard deviation
    assert abs(spread - RULE_ACCEPT * 0.1747) < 1e-4  # 0.11 × the propensities' standard deviation
    assert history.share == PRE_REQUESTS_TOTAL / COHORT and history.mean_requests == 1.0
    longer = demo_behaviour(200.0)[1]
    assert (longer.share, longer.mean_requests) == (1.0, 200.0)
    # Seeded: the same figure on every run, and as small as the benchmark reports.
    first = demo_correlation(np.random.default_rng(7), cohorts=100)
    assert first == demo_correlation(np.random.default_rng(7), cohorts=100)
    assert -0.05 < first < 0.08
