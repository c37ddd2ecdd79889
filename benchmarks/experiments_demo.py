"""The demo's A/B users as the experiments benchmark simulates them, from the demo's own
simulated developers (``benchmarks/simdev``) and the rates ``make demo`` measured, each with a
propensity of their own (``simdev.traits``). ``make demo`` itself ran with that propensity for one
day (2026-11-27) and runs without it since: it cut a round's accepted suggestions below what the
show filter needs. Without it the demo's developers are alike and their history predicts nothing
(a correlation of 0): the propensity is the most the demo's population could carry.

In ``make demo`` (``demo/loop.py``) a round's 288 opted-in developers first work on production
(the round's 128 requests, one each for the first 128: 44 % of the cohort), then meet the A/B
experiment with 4 requests each. Production is the base model: it shows a suggestion on about
95 % of requests, and the population's rule accepts about 11 % of those (benchmarks/results-log.md,
demos of 2026-11-24 and 2026-11-27: 8–12 %). Each developer takes what the rule accepts with their
own propensity q ~ Beta(4, 1.5) (``simdev.traits``), so their accept probability is 0.11 q, in
both periods.

``demo_correlation`` simulates exactly that (fixed request counts) and measures the pre/post
correlation of reward per request; ``demo_behaviour`` gives the ``stats.simulate`` parameters of
the same population (accept probabilities Beta with the same mean and spread; requests geometric
with the same means), which the benchmark's adjusted simulations run on.
"""

from __future__ import annotations

import numpy as np

from apps.experiments.stats.simulate import (
    REWARD_ACCEPTED,
    REWARD_REJECTED,
    History,
    UserBehaviour,
    pre_post_correlation,
)

COHORT = 288
PRE_REQUESTS_TOTAL = 128
DURING_REQUESTS = 4
SHOW_RATE = 0.95
RULE_ACCEPT = 0.11


def _propensity_beta() -> tuple[float, float]:
    try:  # run as a benchmark script (benchmarks/ on the path) or imported by the tests
        from simdev.traits import PROPENSITY_BETA
    except ImportError:
        from benchmarks.simdev.traits import PROPENSITY_BETA
    return PROPENSITY_BETA


def demo_behaviour(pre_requests: float | None = None) -> tuple[UserBehaviour, History]:
    """(behaviour of a user in either arm before any lift, their history): the demo's population,
    or with ``pre_requests`` each user (all with history) making that many production requests
    on average before exposure (a longer pre-period)."""
    a, b = _propensity_beta()
    mean_q = a / (a + b)
    var_q = a * b / ((a + b) ** 2 * (a + b + 1))
    p = RULE_ACCEPT * mean_q
    kappa = p * (1 - p) / (RULE_ACCEPT**2 * var_q) - 1  # Beta(κp, κ(1 − p)) with the same variance
    behaviour = UserBehaviour(
        mean_requests=DURING_REQUESTS, show_rate=SHOW_RATE, accept_rate=p, accept_concentration=kappa, error_rate=0.0
    )
    if pre_requests is None:
        history = History(share=PRE_REQUESTS_TOTAL / COHORT, mean_requests=1.0, activity_sigma=0.0)
    else:
        history = History(share=1.0, mean_requests=pre_requests, activity_sigma=0.0)
    return behaviour, history


def demo_correlation(rng: np.random.Generator, cohorts: int = 400) -> float:
    """The pre/post correlation of reward per request over the demo's A/B users with history,
    simulated as the demo runs (``cohorts`` cohorts of ``COHORT`` developers pooled)."""
    a, b = _propensity_beta()
    users = cohorts * COHORT
    accept = RULE_ACCEPT * rng.beta(a, b, users)
    pre_requests = np.zeros(users, dtype=np.int64)
    pre_requests[rng.permutation(users)[: cohorts * PRE_REQUESTS_TOTAL]] = 1

    def period(requests: np.ndarray) -> dict[str, np.ndarray]:
        shown = rng.binomial(requests, SHOW_RATE)
        accepted = rng.binomial(shown, accept)
        reward = REWARD_ACCEPTED * accepted + REWARD_REJECTED * (shown - accepted)
        return {"requests": requests, "shown": shown, "accepted": accepted, "reward_sum": reward}

    return pre_post_correlation(period(pre_requests), period(np.full(users, DURING_REQUESTS)))
