"""The calibration maps: from the probabilities the model gave to calibrated ones.

Each map takes one answer's distribution (option order; noul ``[P(true), P(false)]``)
and returns a new one that sums to 1.

- ``temperature``: p_i^(1/T) renormalised, which is softmax(l / T) for the label
  log-probabilities l. A monotone map of every p_i: the choice never changes.
- ``platt`` (noul only): P'(true) = sigmoid(a * logit(P(true)) + b). With b != 0
  or a < 0 it can turn a yes into a no; that is what it was fitted to do.
- ``isotonic``: a non-decreasing piecewise-linear map f given by knots.
  noul: P'(true) = f(P(true)), so it too can turn a yes into a no.
  choice and score: the top probability p becomes q = f(p) and the other
  options are rescaled by (1 - q) / (1 - p), keeping their ratios. q is raised
  to the value at which the runner-up would tie, so the choice never changes.
  (f is fitted on the top probability of every answer of the type, whatever
  its number of options.)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "Method",
    "METHODS",
    "PROBABILITY_FLOOR",
    "temperature_scale",
    "platt_scale",
    "isotonic_map",
    "isotonic_scale",
    "logit",
    "sigmoid",
    "apply_method",
    "top_index",
]

Method = Literal["none", "temperature", "platt", "isotonic"]
METHODS: tuple[str, ...] = ("none", "temperature", "platt", "isotonic")
PROBABILITY_FLOOR = 1e-300  # log(0) stand-in: keeps every log-probability finite


def top_index(probs: Sequence[float]) -> int:
    """The chosen option: argmax_i p_i, the first one on ties."""
    return max(range(len(probs)), key=lambda i: probs[i])


def _keep_choice(original: Sequence[float], out: list[float]) -> list[float]:
    """If rounding made another option tie the original choice, lift the choice by one ulp."""
    best = top_index(original)
    if top_index(out) != best:
        out[best] = math.nextafter(max(out), math.inf)
    return out


def temperature_scale(probs: Sequence[float], temperature: float) -> list[float]:
    """p'_i = p_i^(1/T) / sum_j p_j^(1/T) = softmax(log p / T), computed in logs
    shifted by the largest; T > 0, so the order of the options never changes."""
    if not temperature > 0 or not math.isfinite(temperature):
        raise ValueError("temperature must be a positive finite number")
    logs = [math.log(max(p, PROBABILITY_FLOOR)) / temperature for p in probs]
    top = max(logs)
    weights = [math.exp(lg - top) for lg in logs]
    total = math.fsum(weights)
    return _keep_choice(probs, [w / total for w in weights])


def logit(p: float) -> float:
    """log(p / (1 - p)), p clipped to [1e-12, 1 - 1e-12]."""
    p = min(max(p, 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))


def sigmoid(x: float) -> float:
    """1 / (1 + exp(-x)), without overflow."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def platt_scale(probs: Sequence[float], a: float, b: float) -> list[float]:
    """[q, 1 - q] with q = sigmoid(a * logit(P(true)) + b); noul answers only."""
    if len(probs) != 2:
        raise ValueError("Platt scaling applies to noul answers [P(true), P(false)] only")
    q = sigmoid(a * logit(probs[0]) + b)
    return [q, 1.0 - q]


def isotonic_map(x: float, knots_x: Sequence[float], knots_y: Sequence[float]) -> float:
    """f(x): linear between the knots (x ascending, y non-decreasing), constant outside."""
    if x <= knots_x[0]:
        return knots_y[0]
    if x >= knots_x[-1]:
        return knots_y[-1]
    i = bisect.bisect_right(knots_x, x)
    x0, x1, y0, y1 = knots_x[i - 1], knots_x[i], knots_y[i - 1], knots_y[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def isotonic_scale(
    probs: Sequence[float], kind: str, knots_x: Sequence[float], knots_y: Sequence[float]
) -> list[float]:
    """noul: [f(P(true)), 1 - f(P(true))]. choice/score: the top p becomes
    q = max(f(p), p2 / (R + p2)) and the others are multiplied by (1 - q) / R (R their sum,
    p2 the runner-up: below that bound it would overtake); if R = 0 they share 1 - q
    evenly and q is at least 1/n."""
    if kind == "noul":
        q = isotonic_map(probs[0], knots_x, knots_y)
        return [q, 1.0 - q]
    best = top_index(probs)
    rest = [x for i, x in enumerate(probs) if i != best]
    rest_total = math.fsum(rest)
    # the runner-up p2 becomes p2 (1 - q) / R (R the others' sum): it ties q at q = p2 / (R + p2)
    floor = max(rest) / (rest_total + max(rest)) if rest_total > 0 else 1.0 / len(probs)
    q = min(1.0, max(isotonic_map(probs[best], knots_x, knots_y), floor))
    if rest_total > 0:
        scale = (1.0 - q) / rest_total
        out = [q if i == best else x * scale for i, x in enumerate(probs)]
    else:  # a certain answer: share what the map took from it evenly
        share = (1.0 - q) / (len(probs) - 1)
        out = [q if i == best else share for i in range(len(probs))]
    return _keep_choice(probs, out)


def apply_method(
    method: str, params: Mapping[str, Any], kind: str, probs: Sequence[float]
) -> list[float]:
    """Apply one fitted method (see the module docstring) to one answer."""
    if not probs:
        raise ValueError("no probabilities")
    if method == "none":
        return [float(p) for p in probs]
    if method == "temperature":
        return temperature_scale(probs, params["temperature"])
    if method == "platt":
        return platt_scale(probs, params["a"], params["b"])
    if method == "isotonic":
        return isotonic_scale(probs, kind, params["x"], params["y"])
    raise ValueError(f"unknown calibration method {method!r}")
