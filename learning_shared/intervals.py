"""95 % intervals for offline figures: Wilson's for a proportion, the normal approximation for a
mean (Student's t; a paired difference is the mean of per-case differences).

Pure Python and a leaf of the package, JSON-ready: an undefined bound is None, never NaN.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A figure over ``n`` observations and its 95 % interval; ``value`` is None when n is 0, the
    bounds are None where n is too small for an interval."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}


def wilson(successes: int, n: int, z: float = Z95) -> Estimate:
    """A proportion with its Wilson score interval: sound near 0 and 1 and for a few dozen cases,
    where the normal interval runs outside [0, 1] or collapses to a point."""
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..n, got {successes} of {n}")
    if n == 0:
        return Estimate(None, None, None, 0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At 0 and at n the bounds land a rounding error inside the value: they hold it exactly.
    return Estimate(p, min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)), n)


# Student's t at 97.5 % for 1..30 degrees of freedom: a mean of a few dozen cases is wider than z says.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
MIN_MEAN_INTERVAL_N = 5
"""Fewer values than this have no interval: a handful of equal differences would otherwise make a
zero-width interval that reads as certain."""


def mean_interval(values: Sequence[float]) -> Estimate:
    """A mean with its 95 % interval mean ± t·s/√n (s: the sample standard deviation; Student's t
    for n − 1 degrees of freedom up to 30, the normal quantile beyond). Fewer than
    ``MIN_MEAN_INTERVAL_N`` values have no interval."""
    n = len(values)
    if n == 0:
        return Estimate(None, None, None, 0)
    mean = statistics.fmean(values)
    if n < MIN_MEAN_INTERVAL_N:
        return Estimate(mean, None, None, n)
    quantile = _T975[n - 2] if n - 1 <= len(_T975) else Z95
    half = quantile * statistics.stdev(values) / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n)
