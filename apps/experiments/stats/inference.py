"""The estimators and tests behind an experiment snapshot, on numpy arrays.

Every function here works elementwise on scalars or arrays of the same shape, so one snapshot
and a whole grid of simulated experiments × peeks go through the same code. Undefined results
(no users, no denominator, no variance) are NaN here; the analysis layer turns them into None.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats as scipy_stats

FloatArray = NDArray[np.float64]

# Bounds of the search for the always-valid p-value, in L = −ln α: α from 1 − 1e−12 down to
# e^−700 ≈ 1e−304 (the smallest p we report; still a finite float for JSON).
_MIN_NEG_LOG_ALPHA = 1e-12
_MAX_NEG_LOG_ALPHA = 700.0
_BISECTION_STEPS = 80  # the interval in L shrinks below float resolution well before this


@dataclass(frozen=True)
class RatioMoments:
    """Sufficient statistics of a ratio metric Σ y / Σ x over users (y, x: per-user sums).

    Each field is a scalar or an array (one entry per arm, peek or simulated experiment). A
    per-user mean is the special case x ≡ 1.
    """

    n: FloatArray
    sum_y: FloatArray
    sum_x: FloatArray
    sum_yy: FloatArray
    sum_xx: FloatArray
    sum_xy: FloatArray

    @classmethod
    def from_users(cls, y: ArrayLike, x: ArrayLike) -> RatioMoments:
        """Moments of one group of users; ``y`` and ``x`` are 1-D, one entry per user."""
        y_arr = np.asarray(y, dtype=np.float64)
        x_arr = np.asarray(x, dtype=np.float64)
        # Elementwise products and numpy's pairwise sum, not np.dot: BLAS threads cost more than
        # they save at this size on a busy machine, and pairwise summation loses less precision.
        return cls(
            n=np.float64(y_arr.size),  # type: ignore[arg-type]  # a scalar: each field is a scalar or an array
            sum_y=y_arr.sum(),
            sum_x=x_arr.sum(),
            sum_yy=(y_arr * y_arr).sum(),
            sum_xx=(x_arr * x_arr).sum(),
            sum_xy=(x_arr * y_arr).sum(),
        )

    @classmethod
    def cumulative(cls, y: ArrayLike, x: ArrayLike, mask: ArrayLike, at: ArrayLike) -> RatioMoments:
        """Moments of the users selected by ``mask`` among the first ``at[k]`` users, for every k.

        ``y``, ``x``, ``mask``: (..., users) in arrival order; ``at``: increasing user counts.
        The result has shape (..., len(at)): every peek of every experiment at once.
        """
        m = np.asarray(mask, dtype=np.float64)
        y_arr = np.asarray(y, dtype=np.float64) * m
        x_arr = np.asarray(x, dtype=np.float64) * m
        idx = np.asarray(at, dtype=np.int64) - 1

        def upto(values: FloatArray) -> FloatArray:
            return np.cumsum(values, axis=-1)[..., idx]

        return cls(
            n=upto(m),
            sum_y=upto(y_arr),
            sum_x=upto(x_arr),
            sum_yy=upto(y_arr * y_arr),
            sum_xx=upto(x_arr * x_arr),
            sum_xy=upto(x_arr * y_arr),
        )


def ratio_estimate(m: RatioMoments) -> FloatArray:
    """Σ y / Σ x: the metric as the product reports it (NaN where Σ x = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(m.sum_x != 0, m.sum_y / np.where(m.sum_x != 0, m.sum_x, 1.0), np.nan)


def ratio_variance(m: RatioMoments) -> FloatArray:
    """Variance of Σ y / Σ x by the delta method over users (NaN below 2 users or at Σ x = 0).

    Users, not requests, are the randomised units, and one user's requests are correlated, so a
    binomial variance over requests would be too small. With R = ȳ / x̄ over n users (Deng, Knoblich
    & Lu 2018, "Applying the Delta Method in Metric Analytics: A Practical Guide with Novel Ideas", KDD):

        Var(R) ≈ (Var(y) − 2 R Cov(x, y) + R² Var(x)) / (n x̄²)

    with the n − 1 sample (co)variances, so x ≡ 1 gives s²/n, the standard error² of Welch's test.
    """
    n = np.asarray(m.n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_x = m.sum_x / n
        mean_y = m.sum_y / n
        var_y = (m.sum_yy - n * mean_y * mean_y) / (n - 1)
        var_x = (m.sum_xx - n * mean_x * mean_x) / (n - 1)
        cov_xy = (m.sum_xy - n * mean_x * mean_y) / (n - 1)
        r = mean_y / mean_x
        var = (var_y - 2 * r * cov_xy + r * r * var_x) / (n * mean_x * mean_x)
    # Rounding can leave a tiny negative number where the true value is 0 (constant data).
    var = np.maximum(var, 0.0)
    return np.where((n >= 2) & (m.sum_x != 0), var, np.nan)


def effective_users(m: RatioMoments) -> FloatArray:
    """Kish's effective number of users of Σ y / Σ x: (Σ x)² / Σ x² (NaN where Σ x² = 0).

    The ratio is a mean of the users' own rates y/x weighted by x, so it is worth as many
    equally busy users as this (Kish 1965, *Survey Sampling*, the design effect of unequal
    weights): n when all are alike, far fewer when a few users make most of the requests. It
    also bounds the heaviest user's share of Σ x by 1/√(effective users), the share that must be
    small for the normal approximation (Lindeberg's condition) behind every interval here.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(m.sum_xx > 0, m.sum_x * m.sum_x / np.where(m.sum_xx > 0, m.sum_xx, 1.0), np.nan)


def relative_lift(control: ArrayLike, candidate: ArrayLike) -> FloatArray:
    """(candidate − control) / |control|: positive when the candidate is higher, even for a
    negative control (mean reward can be below zero), NaN when the control is 0."""
    a = np.asarray(control, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a != 0, (b - a) / np.abs(a), np.nan)


def relative_lift_variance(
    control: ArrayLike, control_var: ArrayLike, candidate: ArrayLike, candidate_var: ArrayLike
) -> FloatArray:
    """Delta-method variance of the relative lift of two independent arm estimates.

    With A, B the arm means: d/dB = 1/|A|, d/dA = −B/(A|A|), so
    Var ≈ Var(B)/A² + B² Var(A)/A⁴ (the delta method on a ratio of two independent means, as in
    Deng et al. 2018). The same formula holds for a negative control. Being first order, it needs
    a small coefficient of variation of A: reward per request sits near 0, so its relative interval
    is rough on small samples (≈ 10% off at a 13% CV). Decisions rest on the absolute lift.
    """
    a = np.asarray(control, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a != 0, np.asarray(candidate_var) / a**2 + b**2 * np.asarray(control_var) / a**4, np.nan)


def z_quantile(alpha: float) -> float:
    """z with P(|Z| > z) = α: the fixed-horizon two-sided critical value."""
    return float(scipy_stats.norm.isf(alpha / 2))


def fixed_p_value(diff: ArrayLike, se: ArrayLike) -> FloatArray:
    """Two-sided z-test p-value of a difference with standard error ``se`` (NaN where se ≤ 0)."""
    se_arr = np.asarray(se, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.abs(np.asarray(diff, dtype=np.float64)) / se_arr
    return np.where(se_arr > 0, 2 * scipy_stats.norm.sf(z), np.nan)


def always_valid_half_width(se: ArrayLike, n: ArrayLike, alpha: ArrayLike, n_star: float) -> FloatArray:
    """Half-width of the asymptotic confidence sequence for a difference of means.

    Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas (2023), "Time-uniform central limit theory and
    asymptotic confidence sequences" (arXiv:2103.06476): their two-sided Gaussian-mixture
    asymptotic CS, with the closed-form ρ that GrowthBook uses for sequential testing:

        n  = n_A + n_B (users),  s² = SE² · n  (SE of the absolute difference),
        ρ  = sqrt((−2 ln α + ln(−2 ln α + 1)) / N*),
        hw = sqrt(s²) · sqrt(2 (n ρ² + 1) / (n² ρ²) · ln(sqrt(n ρ² + 1) / α)).

    ρ makes the sequence tightest near n = N*, the tuning sample size; coverage holds uniformly
    over every n however often one looks. Wider than the fixed-horizon interval at every n.
    """
    se_arr = np.asarray(se, dtype=np.float64)
    n_arr = np.asarray(n, dtype=np.float64)
    neg_log_alpha = -np.log(np.asarray(alpha, dtype=np.float64))
    return _half_width(se_arr, n_arr, neg_log_alpha, n_star)


def _half_width(se: FloatArray, n: FloatArray, neg_log_alpha: FloatArray, n_star: float) -> FloatArray:
    # Written in L = −ln α (log1p for ln(2L + 1)) so α close to 1 stays accurate for the p-value search.
    rho_sq = (2 * neg_log_alpha + np.log1p(2 * neg_log_alpha)) / n_star
    u = n * rho_sq
    with np.errstate(divide="ignore", invalid="ignore"):
        width_sq = 2 * (u + 1) / (n * n * rho_sq) * (0.5 * np.log1p(u) + neg_log_alpha)
        return se * np.sqrt(n) * np.sqrt(width_sq)


def always_valid_p_value(diff: ArrayLike, se: ArrayLike, n: ArrayLike, n_star: float) -> FloatArray:
    """The smallest α at which the confidence sequence excludes 0, capped at 1 (NaN where se ≤ 0).

    The half-width grows as α shrinks (checked numerically over n, α and N* in the tests), so the
    set of α that exclude 0 is an interval (p, 1) and bisection in L = −ln α finds p. Because the
    sequence is wider than the fixed interval at every α, this p is never below the fixed one.
    """
    d = np.abs(np.asarray(diff, dtype=np.float64))
    se_arr = np.asarray(se, dtype=np.float64)
    n_arr = np.asarray(n, dtype=np.float64)
    d, se_arr, n_arr = np.broadcast_arrays(d, se_arr, n_arr)
    # Invariant: the sequence excludes 0 at L = lo (width < d) and not at L = hi.
    lo = np.full(d.shape, _MIN_NEG_LOG_ALPHA)
    hi = np.full(d.shape, _MAX_NEG_LOG_ALPHA)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        excludes = _half_width(se_arr, n_arr, mid, n_star) < d
        lo = np.where(excludes, mid, lo)
        hi = np.where(excludes, hi, mid)
    p = np.exp(-0.5 * (lo + hi))
    never = ~(_half_width(se_arr, n_arr, np.full(d.shape, _MIN_NEG_LOG_ALPHA), n_star) < d)
    always = _half_width(se_arr, n_arr, np.full(d.shape, _MAX_NEG_LOG_ALPHA), n_star) < d
    p = np.where(never, 1.0, np.where(always, np.exp(-_MAX_NEG_LOG_ALPHA), p))
    return np.where((se_arr > 0) & (n_arr > 0), p, np.nan)


def srm_chi_square(observed: ArrayLike, weights: ArrayLike) -> tuple[float, float]:
    """Pearson chi-square of users per arm against the configured weights: (statistic, p).

    A sample-ratio mismatch means assignment or exposure logging is broken, and then every metric
    is suspect (Fabijan, Gupchup, Gupta, Omhover, Qin, Vermeer & Dmitriev 2019, "Diagnosing Sample
    Ratio Mismatch in Online Controlled Experiments", KDD). NaN for no users at all.
    """
    obs = np.asarray(observed, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    total = obs.sum()
    if total <= 0:
        return float("nan"), float("nan")
    expected = total * w / w.sum()
    statistic = float(((obs - expected) ** 2 / expected).sum())
    return statistic, float(scipy_stats.chi2.sf(statistic, df=obs.size - 1))
