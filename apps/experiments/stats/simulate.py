"""Simulated users that look like the product, for the tests and the experiments benchmark.

A user makes a geometric number of requests (at least one: users are assigned on their first
request); some fail; a share of the others show a suggestion; each user accepts shown
suggestions with their own probability (Beta-distributed across users, so users differ and the
user-level variance matters); latency is log-normal with a per-user factor.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from . import adjustment, inference
from .config import ExperimentConfig
from .metrics import METRICS, ArmData, count_slow_requests, pooled_p95, slow_request_threshold

# The default reward policy of training (TrainingPolicy): accepted +0.75, rejected −0.25, not shown 0.
REWARD_ACCEPTED = 0.75
REWARD_REJECTED = -0.25


@dataclass(frozen=True)
class UserBehaviour:
    """How the users of one arm behave."""

    mean_requests: float = 20.0
    show_rate: float = 0.6
    """Share of successful requests that show a suggestion."""
    accept_rate: float = 0.3
    """Mean per-user probability of accepting a shown suggestion."""
    accept_concentration: float = 10.0
    """κ of the per-user Beta(κp, κ(1 − p)) accept probability: smaller, more different users."""
    error_rate: float = 0.01
    latency_median_ms: float = 150.0
    latency_sigma: float = 0.5
    """Log-normal σ of one request's latency around the user's own median."""
    user_latency_sigma: float = 0.2
    """Log-normal σ of the users' medians around ``latency_median_ms``."""

    def with_accept_lift(self, relative: float) -> UserBehaviour:
        return dataclasses.replace(self, accept_rate=self.accept_rate * (1 + relative))

    def with_reward_lift(self, relative: float) -> UserBehaviour:
        """The same users with a higher accept rate, chosen so reward per request is ×(1 + relative)."""
        per_shown = self.accept_rate * REWARD_ACCEPTED + (1 - self.accept_rate) * REWARD_REJECTED
        target = per_shown * (1 + relative)
        return dataclasses.replace(self, accept_rate=(target - REWARD_REJECTED) / (REWARD_ACCEPTED - REWARD_REJECTED))

    def reward_per_request(self) -> float:
        """The population value of the primary metric."""
        per_shown = self.accept_rate * REWARD_ACCEPTED + (1 - self.accept_rate) * REWARD_REJECTED
        return (1 - self.error_rate) * self.show_rate * per_shown


def simulate_users(
    behaviour: UserBehaviour, size: int | tuple[int, ...], rng: np.random.Generator
) -> dict[str, NDArray]:
    """Per-user sums (requests, shown, accepted, reward_sum, errors) of ``size`` users."""
    requests = rng.geometric(1 / behaviour.mean_requests, size)
    errors = rng.binomial(requests, behaviour.error_rate)
    shown = rng.binomial(requests - errors, behaviour.show_rate)
    kappa, p = behaviour.accept_concentration, behaviour.accept_rate
    accepted = rng.binomial(shown, rng.beta(kappa * p, kappa * (1 - p), size))
    reward = REWARD_ACCEPTED * accepted + REWARD_REJECTED * (shown - accepted)
    return {"requests": requests, "shown": shown, "accepted": accepted, "reward_sum": reward, "errors": errors}


@dataclass(frozen=True)
class History:
    """How users behaved before the experiment, on production: the same people, so their own
    accept probability and how busy they are carry over, and that is what makes the pre-period
    predict the experiment."""

    share: float = 0.8
    """Share of users with any request in the pre-exposure window (the rest are new)."""
    mean_requests: float = 20.0
    """Mean requests in the window of a user with history."""
    activity_sigma: float = 0.5
    """Log-normal σ of a user's own activity, scaling their mean requests in both periods."""


def simulate_users_with_history(
    control: UserBehaviour,
    behaviours: tuple[UserBehaviour, ...],
    history: History,
    size: int | tuple[int, ...],
    rng: np.random.Generator,
) -> tuple[dict[str, NDArray], list[dict[str, NDArray]]]:
    """The same ``size`` users before the experiment (on ``control``, production) and in it
    under each of ``behaviours``: (pre-period sums, [sums under each behaviour]). A behaviour's
    higher accept rate scales every user's own accept probability by the same factor."""
    kappa, p = control.accept_concentration, control.accept_rate
    own_accept = rng.beta(kappa * p, kappa * (1 - p), size)
    activity = np.exp(rng.normal(0, history.activity_sigma, size) - history.activity_sigma**2 / 2)

    def period(behaviour: UserBehaviour, mean_requests: NDArray, accept: NDArray) -> dict[str, NDArray]:
        requests = rng.geometric(1 / np.maximum(mean_requests, 1.0))
        errors = rng.binomial(requests, behaviour.error_rate)
        shown = rng.binomial(requests - errors, behaviour.show_rate)
        accepted = rng.binomial(shown, np.clip(accept, 0, 1))
        reward = REWARD_ACCEPTED * accepted + REWARD_REJECTED * (shown - accepted)
        return {"requests": requests, "shown": shown, "accepted": accepted, "reward_sum": reward, "errors": errors}

    pre = period(control, history.mean_requests * activity, own_accept)
    has_history = rng.random(size) < history.share
    pre = {name: np.where(has_history, values, 0) for name, values in pre.items()}
    during = [period(b, b.mean_requests * activity, own_accept * b.accept_rate / p) for b in behaviours]
    return pre, during


def pre_post_correlation(pre: dict[str, NDArray], post: dict[str, NDArray]) -> float:
    """Pearson correlation, over users with history, of reward per request before and during."""
    has = pre["requests"] > 0
    before = pre["reward_sum"][has] / pre["requests"][has]
    during = post["reward_sum"][has] / post["requests"][has]
    return float(np.corrcoef(before, during)[0, 1])


def _latencies(behaviour: UserBehaviour, requests: NDArray, rng: np.random.Generator) -> tuple[NDArray, NDArray]:
    """(user index, latency in ms) of every request of the arm."""
    user_index = np.repeat(np.arange(requests.size), requests.astype(np.int64))
    user_log_median = np.log(behaviour.latency_median_ms) + rng.normal(0, behaviour.user_latency_sigma, requests.size)
    latencies = np.exp(user_log_median[user_index] + rng.normal(0, behaviour.latency_sigma, user_index.size))
    return user_index, latencies


def simulate_experiment(
    control: UserBehaviour,
    candidate: UserBehaviour,
    *,
    users: int,
    rng: np.random.Generator,
    weights: tuple[float, float] = (0.5, 0.5),
    candidate_loss: float = 0.0,
) -> tuple[ArmData, ArmData]:
    """One snapshot: ``users`` assigned at random by ``weights``; then a share ``candidate_loss``
    of the candidate's users goes missing (the bug a sample-ratio check exists to catch)."""
    n_control = int(rng.binomial(users, weights[0] / sum(weights)))
    n_candidate = int(rng.binomial(users - n_control, 1 - candidate_loss))
    control_users = simulate_users(control, n_control, rng)
    candidate_users = simulate_users(candidate, n_candidate, rng)
    control_index, control_latencies = _latencies(control, control_users["requests"], rng)
    candidate_index, candidate_latencies = _latencies(candidate, candidate_users["requests"], rng)
    threshold = slow_request_threshold(control_latencies)
    return (
        ArmData(
            **control_users,
            slow_requests=count_slow_requests(control_index, control_latencies, threshold, n_control),
            latency_p95_ms=pooled_p95(control_latencies),
        ),
        ArmData(
            **candidate_users,
            slow_requests=count_slow_requests(candidate_index, candidate_latencies, threshold, n_candidate),
            latency_p95_ms=pooled_p95(candidate_latencies),
        ),
    )


@dataclass(frozen=True)
class PeekingOutcome:
    """Per simulated experiment, what a person watching the page at every peek would have seen."""

    ever_significant: NDArray[np.bool_]
    """The always-valid interval excluded 0 at some peek (either direction)."""
    ever_better: NDArray[np.bool_]
    """The always-valid interval excluded 0 with the candidate higher at some peek."""
    ever_significant_fixed: NDArray[np.bool_]
    """The fixed-horizon interval excluded 0 at some peek: what naive peeking would declare."""
    users_to_better: NDArray[np.float64] | None = None
    """Users (both arms) at the first peek declared better; inf if never. With ``history``."""
    ever_significant_adjusted: NDArray[np.bool_] | None = None
    """As ``ever_significant``, with the lift adjusted by the users' history."""
    users_to_better_adjusted: NDArray[np.float64] | None = None
    """As ``users_to_better``, adjusted."""

    @property
    def experiments(self) -> int:
        return int(self.ever_significant.size)


def peeking_simulation(
    control: UserBehaviour,
    candidate: UserBehaviour,
    *,
    experiments: int,
    users: int,
    peeks: int,
    rng: np.random.Generator,
    alpha: float = 0.05,
    n_star: float = 5000.0,
    metric: str = "reward_per_request",
    history: History | None = None,
    min_effective_users: float = ExperimentConfig.min_effective_users_per_arm,
) -> PeekingOutcome:
    """Run ``experiments`` experiments of ``users`` users (assigned 50/50 at random, in arrival
    order) and look after every ``users / peeks`` users, with the same estimators and confidence
    sequence as ``analyze``, all experiments and peeks at once. With ``history`` the users have a
    pre-period and the regression-adjusted inference is run beside the unadjusted one. A look
    tests nothing until both arms have ``min_effective_users`` (``inference.effective_users``),
    as ``analyze`` with ``ExperimentConfig.min_effective_users_per_arm``; 0 turns the rule off."""
    definition = METRICS[metric]
    if definition.numerator not in ("requests", "shown", "accepted", "reward_sum", "errors"):
        raise ValueError(f"metric: {metric} needs latencies, which the peeking simulation does not draw")
    shape = (experiments, users)
    in_candidate = rng.random(shape) < 0.5
    # Every user is drawn from both behaviours and the arm picks one: simple, and each arm's users
    # are still independent draws from its own behaviour.
    if history is None:
        as_control = simulate_users(control, shape, rng)
        as_candidate = simulate_users(candidate, shape, rng)
    else:
        pre, (as_control, as_candidate) = simulate_users_with_history(
            control, (control, candidate), history, shape, rng
        )
    at = np.unique(np.linspace(users / peeks, users, peeks).round().astype(np.int64))

    def moments(data: dict[str, NDArray], mask: NDArray) -> inference.RatioMoments:
        return inference.RatioMoments.cumulative(data[definition.numerator], data[definition.denominator], mask, at)

    a, b = moments(as_control, ~in_candidate), moments(as_candidate, in_candidate)
    diff = inference.ratio_estimate(b) - inference.ratio_estimate(a)
    se = np.sqrt(inference.ratio_variance(a) + inference.ratio_variance(b))
    with np.errstate(invalid="ignore"):
        enough = (inference.effective_users(a) >= min_effective_users) & (
            inference.effective_users(b) >= min_effective_users
        )
    has_se = np.isfinite(se) & (se > 0)
    testable = has_se & enough
    with np.errstate(invalid="ignore"):
        av_half = inference.always_valid_half_width(se, a.n + b.n, alpha, n_star)
        significant = testable & (np.abs(diff) > av_half)
        # What naive peeking would declare: fixed-horizon intervals, no rule of any kind.
        significant_fixed = has_se & (np.abs(diff) > inference.z_quantile(alpha) * se)
        better = significant & (diff > 0)
    outcome = PeekingOutcome(
        ever_significant=np.asarray(significant.any(axis=-1)),
        ever_better=np.asarray(better.any(axis=-1)),
        ever_significant_fixed=np.asarray(significant_fixed.any(axis=-1)),
    )
    if history is None:
        return outcome
    z = adjustment.history_covariates(pre["requests"], pre["shown"], pre["accepted"], pre["reward_sum"])

    def covariate_moments(data: dict[str, NDArray], mask: NDArray) -> adjustment.CovariateMoments:
        y, x = data[definition.numerator], data[definition.denominator]
        return adjustment.CovariateMoments.cumulative(z, y * mask, x * mask, mask, at)

    lift = adjustment.adjusted_lift(
        a, b, covariate_moments(as_control, ~in_candidate), covariate_moments(as_candidate, in_candidate)
    )
    # As ``analyze``: the adjusted estimator decides at every look, however few users have history.
    with np.errstate(invalid="ignore"):
        adjusted_half = inference.always_valid_half_width(lift.se, a.n + b.n, alpha, n_star)
        significant_adjusted = enough & np.isfinite(lift.se) & (lift.se > 0) & (np.abs(lift.diff) > adjusted_half)
        better_adjusted = significant_adjusted & (lift.diff > 0)
    return dataclasses.replace(
        outcome,
        users_to_better=_first_users(better, at),
        ever_significant_adjusted=np.asarray(significant_adjusted.any(axis=-1)),
        users_to_better_adjusted=_first_users(better_adjusted, at),
    )


def _first_users(declared: NDArray[np.bool_], at: NDArray) -> NDArray[np.float64]:
    """Per experiment, the users at the first peek where ``declared`` holds; inf if none."""
    first = np.argmax(declared, axis=-1)
    return np.where(declared.any(axis=-1), at[first].astype(np.float64), np.inf)
