"""Honest figures: confidence bounds, bootstrap intervals, a threshold with a guarantee.

Pure arithmetic, no dependencies. Each formula lives in one function whose
docstring states it.

The automation threshold is chosen by fixed-sequence testing (Learn then Test:
Angelopoulos et al., 2021). For each candidate threshold t, from the highest
down, the null hypothesis is "the answers at or above t are less accurate than
the target"; it is rejected when the one-sided Clopper-Pearson lower bound on
their accuracy reaches the target. The procedure stops at the first candidate
it cannot reject and keeps the last one rejected. Because every hypothesis
before the first true null must be rejected for that null to be tested at all,
the chance that any kept threshold is a true null is at most 1 - level, however
many candidates there are. Candidates backed by fewer than ``min_count``
answers are not tested, nor those backed by fewer than could pass at all (n
right of n bound the accuracy below by (1 - level)^(1/n): 59 answers at least
for a 0.95 target at level 0.95): how many answers lie above a threshold
depends only on the probabilities, not on which answers were right, so skipping
them spends no error budget, and it keeps a handful at the very top from ending
the sequence. Both arguments need the probabilities to come from a map fitted
without the answers tested (fit.py holds a threshold split out for that).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

__all__ = [
    "DEFAULT_LEVEL",
    "THRESHOLD_GRID",
    "BOOTSTRAP_RESAMPLES",
    "Interval",
    "ThresholdTest",
    "binomial_tail",
    "clopper_pearson_lower",
    "fewest_to_pass",
    "quantile",
    "wilson_interval",
    "bootstrap_interval",
    "fixed_sequence_threshold",
]

DEFAULT_LEVEL = 0.95
# the candidates, fixed before any data is seen: 0.99, 0.98, ..., 0.01 (highest first)
THRESHOLD_GRID = tuple(round(1 - i / 100, 2) for i in range(1, 100))
BOOTSTRAP_RESAMPLES = 1000


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided interval over ``n`` items (a percentile bootstrap,
    or Wilson's for a share)."""

    value: float
    low: float
    high: float
    n: int


def _log_pmf(i: int, n: int, p: float) -> float:
    return (
        math.lgamma(n + 1)
        - math.lgamma(i + 1)
        - math.lgamma(n - i + 1)
        + i * math.log(p)
        + (n - i) * math.log1p(-p)
    )


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): sum_{i=k}^{n} C(n, i) p^i (1 - p)^(n - i)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    return min(1.0, math.fsum(math.exp(_log_pmf(i, n, p)) for i in range(k, n + 1)))


def clopper_pearson_lower(k: int, n: int, level: float = DEFAULT_LEVEL) -> float:
    """The one-sided Clopper-Pearson lower confidence bound on a success rate after k
    successes in n trials: the p_L with P(X >= k | p_L) = 1 - level (0 when k = 0),
    i.e. the (1 - level) quantile of Beta(k, n - k + 1). For k = n it is (1 - level)^(1/n):
    10 right out of 10 bound the accuracy below by 0.741 at level 0.95."""
    if not 0 <= k <= n or n <= 0:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    if not 0 < level < 1:
        raise ValueError("level must be within (0, 1)")
    alpha = 1 - level
    if k == 0:
        return 0.0
    if k == n:
        return alpha ** (1 / n)
    lo, hi = 0.0, 1.0  # binomial_tail(k, n, p) increases with p
    for _ in range(200):
        mid = (lo + hi) / 2
        if binomial_tail(k, n, mid) < alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    return lo


def fewest_to_pass(target: float, level: float = DEFAULT_LEVEL) -> int | None:
    """The fewest answers whose Clopper-Pearson bound can reach ``target``: the smallest n
    with (1 - level)^(1/n) >= target, i.e. ceil(log(1 - level) / log(target)) (None for a
    target of 1, which no finite count reaches)."""
    if target >= 1:
        return None
    if target <= 0:
        return 1
    n = math.ceil(math.log(1 - level) / math.log(target))
    while n > 1 and (1 - level) ** (1 / (n - 1)) >= target:  # guard the rounding
        n -= 1
    while (1 - level) ** (1 / n) < target:
        n += 1
    return n


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default):
    with x sorted and h = (N - 1) q, x[floor h] + (h - floor h)(x[floor h + 1] - x[floor h])."""
    if not values:
        raise ValueError("no values")
    if not 0 <= q <= 1:
        raise ValueError("q must be within [0, 1]")
    xs = sorted(values)
    h = (len(xs) - 1) * q
    i = math.floor(h)
    if i + 1 >= len(xs):
        return xs[-1]
    return xs[i] + (h - i) * (xs[i + 1] - xs[i])


def wilson_interval(k: int, n: int, level: float = DEFAULT_LEVEL) -> Interval:
    """A share k/n with its two-sided Wilson score interval: with p = k/n and z the
    (1 + level)/2 normal quantile, (p + z^2/2n -+ z sqrt(p(1 - p)/n + z^2/4n^2)) / (1 + z^2/n).
    Closed-form, so it costs nothing on large counts (the drift report's shares)."""
    if not 0 <= k <= n or n <= 0:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    z = NormalDist().inv_cdf((1 + level) / 2)
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    low, high = (centre - spread) / scale, (centre + spread) / scale
    return Interval(p, max(0.0, min(low, p)), min(1.0, max(high, p)), n)  # p inside, rounding


def bootstrap_interval(
    statistic: Callable[[Sequence[int]], float],
    n: int,
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """The statistic on all n items, and the percentile interval of its values on
    ``resamples`` resamples of the item indices drawn with replacement (a seeded RNG, so
    the same data gives the same interval): the (1 - level)/2 and (1 + level)/2 quantiles."""
    if n <= 0:
        raise ValueError("no items")
    rng = random.Random(seed)
    everything = list(range(n))
    values = [statistic(rng.choices(everything, k=n)) for _ in range(resamples)]
    tail = (1 - level) / 2
    return Interval(statistic(everything), quantile(values, tail), quantile(values, 1 - tail), n)


@dataclass(frozen=True)
class ThresholdTest:
    """The outcome of fixed-sequence testing: ``threshold`` None when the first candidate
    tested already failed (or none had ``min_count`` answers): everything goes to review."""

    target_accuracy: float
    level: float
    threshold: float | None
    lower_bound: float | None  # Clopper-Pearson bound on the accuracy at or above it
    accuracy: float | None
    coverage: float
    count: int
    tested: int  # candidates tested, the failing one included


def fixed_sequence_threshold(
    tops: Sequence[float],
    hits: Sequence[bool],
    target: float,
    *,
    level: float = DEFAULT_LEVEL,
    min_count: int = 10,
    grid: Sequence[float] = THRESHOLD_GRID,
) -> ThresholdTest:
    """Test the grid's thresholds from the highest down (module docstring): keep the lowest
    t reached before the first whose answers (top probability >= t, at least ``min_count``
    of them and ``fewest_to_pass``) have a Clopper-Pearson lower bound on their accuracy
    below ``target``."""
    if len(tops) != len(hits) or not tops:
        raise ValueError("one hit per answer, and at least one answer")
    if list(grid) != sorted(grid, reverse=True):
        raise ValueError("the grid must run from the highest threshold down")
    kept: ThresholdTest | None = None
    tested = 0
    fewest = fewest_to_pass(target, level)
    if fewest is None:
        return ThresholdTest(target, level, None, None, None, 0.0, 0, 0)
    for t in grid:
        picked = [h for p, h in zip(tops, hits) if p >= t]
        if len(picked) < max(min_count, fewest):
            continue
        tested += 1
        right = sum(picked)
        bound = clopper_pearson_lower(right, len(picked), level)
        if bound < target:
            break
        kept = ThresholdTest(
            target, level, t, bound, right / len(picked), len(picked) / len(tops), len(picked), 0
        )
    if kept is None:
        return ThresholdTest(target, level, None, None, None, 0.0, 0, tested)
    return ThresholdTest(
        kept.target_accuracy,
        level,
        kept.threshold,
        kept.lower_bound,
        kept.accuracy,
        kept.coverage,
        kept.count,
        tested,
    )
