"""How good a set of probabilistic answers is, against gold labels.

Every function takes the answers as a list of distributions (one probability
per option, in option order; a noul answer is ``[P(true), P(false)]``) and the
gold answers as option indices. The *top probability* of an answer is its
largest probability; its *choice* is the first option that has it
(``proxy.calibration.transform.top_index``). Each formula lives in one function
whose docstring states it. (Named ``scores``, not ``metrics``: ``proxy/metrics.py``
is the proxy's Prometheus collectors.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.calibration.transform import top_index  # the choice, as the proxy serves it

__all__ = [
    "N_BINS",
    "NLL_FLOOR",
    "Bin",
    "CurvePoint",
    "top_probability",
    "accuracy",
    "expected_calibration_error",
    "brier_score",
    "negative_log_likelihood",
    "reliability_bins",
    "coverage_curve",
    "position_shares",
    "summary",
]

N_BINS = 10
NLL_FLOOR = 1e-12

Distributions = Sequence[Sequence[float]]


@dataclass(frozen=True)
class Bin:
    """One equal-width bin of top probabilities: ``[lower, upper)`` (the last one closed)."""

    lower: float
    upper: float
    count: int
    confidence: float | None  # mean top probability of the answers in the bin
    accuracy: float | None  # share of them whose choice is the gold answer


@dataclass(frozen=True)
class CurvePoint:
    """Answers whose top probability is at least ``threshold``: their share and accuracy."""

    threshold: float
    coverage: float
    accuracy: float
    count: int


def top_probability(probs: Sequence[float]) -> float:
    """The confidence an answer states in its choice: max_i p_i."""
    return max(probs)


def _check(probs: Distributions, golds: Sequence[int]) -> None:
    if len(probs) != len(golds):
        raise ValueError(f"{len(probs)} answers but {len(golds)} gold labels")
    if not probs:
        raise ValueError("no answers")
    for p, g in zip(probs, golds):
        if not 0 <= g < len(p):
            raise ValueError(f"gold index {g} outside {len(p)} options")


def accuracy(probs: Distributions, golds: Sequence[int]) -> float:
    """(1/N) sum_n [argmax_i p_ni = y_n]."""
    _check(probs, golds)
    return sum(top_index(p) == g for p, g in zip(probs, golds)) / len(golds)


def _bin_of(top: float, n_bins: int) -> int:
    return min(max(math.floor(top * n_bins), 0), n_bins - 1)


def reliability_bins(probs: Distributions, golds: Sequence[int], n_bins: int = N_BINS) -> list[Bin]:
    """Bin b holds the answers with floor(n_bins * max_i p_i) = b (1.0 goes to the last bin);
    per bin: count, mean top probability, and accuracy of the choices."""
    _check(probs, golds)
    tops: list[list[float]] = [[] for _ in range(n_bins)]
    hits: list[int] = [0] * n_bins
    for p, g in zip(probs, golds):
        b = _bin_of(top_probability(p), n_bins)
        tops[b].append(top_probability(p))
        hits[b] += top_index(p) == g
    out = []
    for b in range(n_bins):
        n = len(tops[b])
        conf = math.fsum(tops[b]) / n if n else None
        acc = hits[b] / n if n else None
        out.append(Bin(b / n_bins, (b + 1) / n_bins, n, conf, acc))
    return out


def expected_calibration_error(
    probs: Distributions, golds: Sequence[int], n_bins: int = N_BINS
) -> float:
    """ECE = sum_b (n_b / N) |acc_b - conf_b| over equal-width bins of the top probability,
    acc_b the accuracy and conf_b the mean top probability of the n_b answers in bin b."""
    bins = reliability_bins(probs, golds, n_bins)
    total = sum(b.count for b in bins)
    return math.fsum(
        b.count / total * abs(b.accuracy - b.confidence)  # type: ignore[operator]
        for b in bins
        if b.count
    )


def brier_score(probs: Distributions, golds: Sequence[int]) -> float:
    """Multi-class Brier score: (1/N) sum_n sum_k (p_nk - y_nk)^2, y_n one-hot on the gold."""
    _check(probs, golds)
    return math.fsum(
        math.fsum((pk - (k == g)) ** 2 for k, pk in enumerate(p)) for p, g in zip(probs, golds)
    ) / len(golds)


def negative_log_likelihood(probs: Distributions, golds: Sequence[int]) -> float:
    """NLL = -(1/N) sum_n log max(p_n,y_n, 1e-12): the mean surprise at the gold answer."""
    _check(probs, golds)
    return -math.fsum(math.log(max(p[g], NLL_FLOOR)) for p, g in zip(probs, golds)) / len(golds)


def coverage_curve(probs: Distributions, golds: Sequence[int]) -> list[CurvePoint]:
    """For each distinct top probability t (ascending): coverage = share of answers with
    max_i p_i >= t, and the accuracy of those answers. Automating every answer at or
    above t covers that share at that accuracy."""
    _check(probs, golds)
    pairs = sorted(
        ((top_probability(p), top_index(p) == g) for p, g in zip(probs, golds)), reverse=True
    )
    points: list[CurvePoint] = []
    hits = 0
    for i, (top, hit) in enumerate(pairs):
        hits += hit
        if i + 1 < len(pairs) and pairs[i + 1][0] == top:
            continue  # equal tops are automated together
        n = i + 1
        points.append(CurvePoint(top, n / len(pairs), hits / n, n))
    return points[::-1]


def position_shares(positions: Sequence[int], n_positions: int) -> list[float]:
    """share_i = (1/N) #{n : position_n = i}, for i < n_positions: how often the choice (or the
    gold answer) sat at the i-th option shown."""
    if not positions:
        raise ValueError("no answers")
    return [sum(pos == i for pos in positions) / len(positions) for i in range(n_positions)]


def summary(probs: Distributions, golds: Sequence[int]) -> dict[str, float]:
    """n, accuracy, ECE, Brier and NLL in one dict (the report's and the profile's row)."""
    return {
        "n": len(golds),
        "accuracy": accuracy(probs, golds),
        "ece": expected_calibration_error(probs, golds),
        "brier": brier_score(probs, golds),
        "nll": negative_log_likelihood(probs, golds),
    }
