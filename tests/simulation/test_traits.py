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
