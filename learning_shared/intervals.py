"""95 % intervals for offline figures: Wilson's for a proportion, the normal approximation for a
mean (a paired difference is the mean of per-case differences).

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


def mean_interval(values: Sequence[float], z: float = Z95) -> Estimate:
    """A mean with the normal interval mean ± z·s/√n (s: the sample standard deviation). One
    value has no interval."""
    n = len(values)
    if n == 0:
        return Estimate(None, None, None, 0)
    mean = statistics.fmean(values)
    if n == 1:
        return Estimate(mean, None, None, 1)
    half = z * statistics.stdev(values) / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n)
