"""Regression adjustment (CUPED) of a ratio metric's lift by each user's pre-exposure behaviour.

Each arm's metric R = Σ y / Σ x is, to first order, the mean of the per-user linearised values
l_i = (y_i − R x_i) / x̄ (the delta method of ``inference.ratio_variance``: Var(R) ≈ Var(l) / n).
A user's behaviour before their first exposure, z_i (k covariates), cannot be moved by the arm,
so z̄_B − z̄_A has mean 0 and subtracting θᵀ(z̄_B − z̄_A) from the lift leaves it unbiased for
any θ. θ is the least-squares slope of l on z within arms (pooled over both), the θ that
minimises the variance; the residual variance Var(l − θᵀz) replaces Var(l) in the standard
error, one degree of freedom per covariate taken from the users, and from the users with
history alone where that costs more (the covariates vary only among them); where there are no
more of those than covariates fitted, none is used and the lift is the unadjusted one. Users
without history carry
the pooled mean (``history_covariates``), so they add nothing to z̄ − μ and their adjustment is
zero; an indicator of history lets the regression give them their own level.

Like ``inference``, every function works elementwise on scalars or stacks (peeks × simulated
experiments), so a snapshot and the benchmark's simulations run the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .inference import FloatArray, RatioMoments, ratio_estimate, ratio_variance

COVARIATE_NAMES = ("pre_reward_per_request", "pre_accept_rate", "pre_excess_reward", "has_history")
_RCOND = 1e-10  # singular values below this share of the largest are dropped (a constant covariate)
_ROUNDING = 1e-9  # residual variance below this share of the unadjusted one is rounding: a perfect fit


@dataclass(frozen=True)
class CovariateMoments:
    """Sums over one group of users of z (k covariates) and its products with z, y and x.

    Shapes: ``sum_z``, ``sum_yz``, ``sum_xz`` (..., k); ``sum_zz`` (..., k, k).
    """

    sum_z: FloatArray
    sum_zz: FloatArray
    sum_yz: FloatArray
    sum_xz: FloatArray

    @classmethod
    def from_users(cls, z: ArrayLike, y: ArrayLike, x: ArrayLike) -> CovariateMoments:
        """``z``: (users, k); ``y``, ``x``: (users,)."""
        z_arr = np.asarray(z, dtype=np.float64)
        # Products with z as matrix products: no (users, k) temporaries (a million users' snapshot).
        return cls(
            sum_z=z_arr.sum(axis=0),
            sum_zz=z_arr.T @ z_arr,
            sum_yz=np.asarray(y, dtype=np.float64) @ z_arr,
            sum_xz=np.asarray(x, dtype=np.float64) @ z_arr,
        )

    @classmethod
    def cumulative(cls, z: ArrayLike, y: ArrayLike, x: ArrayLike, mask: ArrayLike, at: ArrayLike) -> CovariateMoments:
        """As ``RatioMoments.cumulative``: ``z`` (..., users, k), the others (..., users); the
        result has the peeks on the axis before k."""
        m = np.asarray(mask, dtype=np.float64)[..., None]
        z_arr = np.asarray(z, dtype=np.float64) * m
        y_arr = np.asarray(y, dtype=np.float64)[..., None]
        x_arr = np.asarray(x, dtype=np.float64)[..., None]
        idx = np.asarray(at, dtype=np.int64) - 1

        def upto(values: FloatArray) -> FloatArray:
            return np.cumsum(values, axis=z_arr.ndim - 2)[..., idx, :]

        zz = z_arr[..., :, None] * z_arr[..., None, :]
        cum_zz = np.cumsum(zz, axis=z_arr.ndim - 2)[..., idx, :, :]
        return cls(sum_z=upto(z_arr), sum_zz=cum_zz, sum_yz=upto(z_arr * y_arr), sum_xz=upto(z_arr * x_arr))


@dataclass(frozen=True)
class AdjustedLift:
    diff: FloatArray
    """Adjusted candidate − control."""
    se: FloatArray
    """Its standard error (NaN where not testable)."""
    variance_reduction: FloatArray
    """1 − adjusted variance / unadjusted variance of the lift."""
    fitted: FloatArray
    """How many covariates the fit used (0: too few users with history, the lift is unadjusted)."""


def _within(m: RatioMoments, c: CovariateMoments) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """(z̄, centred Σ zzᵀ, centred Σ z·l, centred Σ l²) of one arm."""
    n = np.asarray(m.n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_x = m.sum_x / n
        mean_y = m.sum_y / n
        r = mean_y / mean_x
        mean_z = c.sum_z / n[..., None]
        s_zz = c.sum_zz - n[..., None, None] * mean_z[..., :, None] * mean_z[..., None, :]
        s_zy = c.sum_yz - n[..., None] * mean_z * mean_y[..., None]
        s_zx = c.sum_xz - n[..., None] * mean_z * mean_x[..., None]
        s_zl = (s_zy - r[..., None] * s_zx) / mean_x[..., None]
        s_ll = ratio_variance(m) * n * (n - 1)
    return mean_z, s_zz, s_zl, s_ll


def adjusted_lift(
    control: RatioMoments, candidate: RatioMoments, control_z: CovariateMoments, candidate_z: CovariateMoments
) -> AdjustedLift:
    """The regression-adjusted lift of candidate over control and its standard error."""
    za, s_zz_a, s_zl_a, s_ll_a = _within(control, control_z)
    zb, s_zz_b, s_zl_b, s_ll_b = _within(candidate, candidate_z)
    s_zz = np.nan_to_num(s_zz_a + s_zz_b)
    s_zl = np.nan_to_num(s_zl_a + s_zl_b)
    # Least squares within arms; pinv drops a covariate with no spread (everyone without history).
    theta = (np.linalg.pinv(s_zz, rcond=_RCOND, hermitian=True) @ s_zl[..., None])[..., 0]
    k = _rank(s_zz)
    # The covariates vary only among the users with history (the last column is the indicator),
    # so the k fitted coefficients are paid for by those m users. Where m ≤ k the fit is exact
    # for each of them and leaves none of their variance to estimate: the covariates are not
    # used (θ = 0) and the adjusted lift is the unadjusted one, as with nobody with history.
    with_history = np.nan_to_num(control_z.sum_z[..., -1] + candidate_z.sum_z[..., -1])
    diff = ratio_estimate(candidate) - ratio_estimate(control)
    na, nb = np.asarray(control.n, dtype=np.float64), np.asarray(candidate.n, dtype=np.float64)
    fitted = (with_history > k) & (na + nb - 2 - k > 0)
    theta = np.where(fitted[..., None], theta, 0.0)
    k = np.where(fitted, k, 0.0)

    def residual_sq(s_ll: FloatArray, s_zl_arm: FloatArray, s_zz_arm: FloatArray) -> FloatArray:
        explained = 2 * (theta * s_zl_arm).sum(axis=-1) - np.einsum("...i,...ij,...j->...", theta, s_zz_arm, theta)
        # A fit that explains all of l up to rounding leaves no variance to test with (SE 0).
        left = np.where(s_ll - explained > _ROUNDING * s_ll, s_ll - explained, 0.0)
        return np.where(fitted, left, s_ll)

    with np.errstate(divide="ignore", invalid="ignore"):
        mean_x_a, mean_x_b = control.sum_x / na, candidate.sum_x / nb
        adjusted = diff - (theta * (zb - za)).sum(axis=-1)
        # One degree of freedom per covariate fitted, counted against the users of both arms and
        # against the users with history, whichever costs more: with a few (busy) users with
        # history the fit all but reproduces their values, and their share of the variance,
        # often most of it, would otherwise be missing from the residuals.
        dof = np.where(fitted, np.maximum((na + nb - 2) / (na + nb - 2 - k), with_history / (with_history - k)), 1.0)
        var_a = residual_sq(s_ll_a, s_zl_a, s_zz_a) / (na * (na - 1)) * dof
        var_b = residual_sq(s_ll_b, s_zl_b, s_zz_b) / (nb * (nb - 1)) * dof
        var = var_a + var_b
        unadjusted = ratio_variance(control) + ratio_variance(candidate)
        ok = np.isfinite(var) & (mean_x_a != 0) & (mean_x_b != 0)
        se = np.where(ok, np.sqrt(var), np.nan)
        reduction = np.where(ok & (unadjusted > 0), 1 - var / unadjusted, np.nan)
    return AdjustedLift(diff=np.where(ok, adjusted, np.nan), se=se, variance_reduction=reduction, fitted=k)


def _rank(s_zz: FloatArray) -> FloatArray:
    """The covariates the fit used: eigenvalues kept by the same cut as ``pinv``."""
    eigen = np.abs(np.linalg.eigvalsh(s_zz))
    top = eigen.max(axis=-1, keepdims=True)
    return ((eigen > _RCOND * top) & (top > 0)).sum(axis=-1).astype(np.float64)


def history_covariates(
    requests: ArrayLike, shown: ArrayLike, accepted: ArrayLike, reward_sum: ArrayLike
) -> NDArray[np.float64]:
    """Per user, from their sums over the pre-exposure window (``COVARIATE_NAMES``): reward per
    request, accept rate of shown suggestions, excess reward (reward − pooled reward per request ×
    requests: the reward rate weighted by how busy the user is, the form in which a user enters a
    ratio metric) and 1 for a user with any request in it (always the last column).

    Inputs (..., users); result (..., users, 4). A user without requests (or without a shown
    suggestion, for the accept rate) gets the pooled value of the users given, so all users of
    both arms are passed together; with the history indicator beside it, the value a user
    without history carries does not change the fit at all. Nobody with history gives constant
    columns, which the adjustment ignores: the lift is then the unadjusted one."""
    req = np.asarray(requests, dtype=np.float64)
    sh = np.asarray(shown, dtype=np.float64)
    acc = np.asarray(accepted, dtype=np.float64)
    rew = np.asarray(reward_sum, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        req_total, shown_total = req.sum(axis=-1, keepdims=True), sh.sum(axis=-1, keepdims=True)
        pooled_reward = np.where(req_total > 0, rew.sum(axis=-1, keepdims=True) / req_total, 0.0)
        pooled_accept = np.where(shown_total > 0, acc.sum(axis=-1, keepdims=True) / shown_total, 0.0)
        reward_rate = np.where(req > 0, rew / np.where(req > 0, req, 1), pooled_reward)
        accept_rate = np.where(sh > 0, acc / np.where(sh > 0, sh, 1), pooled_accept)
    excess = rew - pooled_reward * req
    return np.stack([reward_rate, accept_rate, excess, (req > 0).astype(np.float64)], axis=-1)
