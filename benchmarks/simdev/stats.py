"""95 % intervals for the session figures: Wilson for proportions, the normal approximation for means."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A figure, its 95 % interval and the number of observations (``nan`` where n is too small)."""

    value: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        if math.isnan(self.value):
            return f"n/a (n={self.n})"
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}] (n={self.n})"


def wilson(successes: int, n: int, z: float = Z95) -> Estimate:
    """A proportion with its Wilson score interval (sound near 0 and 1, unlike the normal one)."""
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be within 0..n, got {successes} of {n}")
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def mean_interval(values: Sequence[float], z: float = Z95) -> Estimate:
    """A mean with the normal interval mean ± z·s/√n (s: the sample standard deviation, n − 1).
    The interval needs two observations; with one it is ``nan``."""
    n = len(values)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    mean = statistics.fmean(values)
    if n == 1:
        return Estimate(mean, math.nan, math.nan, 1)
    half = z * statistics.stdev(values) / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n)
