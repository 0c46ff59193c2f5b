"""Fitting calibration on labelled answers, judged on held-out folds.

For each question type separately: split the items into k folds (fixed by a
seed), fit each candidate method on k-1 folds and apply it to the fold left
out, so every item gets a held-out calibrated answer. A method is kept only if
its held-out NLL beats the uncalibrated answers and its held-out ECE is no
worse than theirs; Platt and isotonic must also beat plain temperature scaling
on NLL when that was tried. The best kept method is
then fitted on all items of that type.

The automation threshold is chosen on the held-out calibrated answers of all
types together: the smallest top probability t such that the answers at or
above t reach the target accuracy, counting only thresholds backed by at least
``min_count`` answers (one lucky answer at the top proves nothing). When no t
does, the threshold is ``None`` and every answer goes to review.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .metrics import (
    coverage_curve,
    expected_calibration_error,
    negative_log_likelihood,
    summary,
    top_index,
    top_probability,
)
from .transform import PROBABILITY_FLOOR, calibrate, logit, sigmoid

__all__ = [
    "KINDS",
    "EXTRA_METHODS",
    "MIN_ITEMS",
    "MIN_AUTOMATED",
    "T_RANGE",
    "Labelled",
    "KindFit",
    "ThresholdChoice",
    "CalibrationFit",
    "fit_temperature",
    "fit_platt",
    "fit_isotonic",
    "fit_method",
    "fold_ids",
    "held_out",
    "fit_kind",
    "choose_threshold",
    "fit_calibration",
]

KINDS = ("choice", "score", "noul")
EXTRA_METHODS = ("platt", "isotonic")
MIN_ITEMS = 10  # fewer items of a type than this (or than 2 per fold): left uncalibrated
MIN_AUTOMATED = 10  # a threshold must be backed by at least this many held-out answers
T_RANGE = (0.01, 100.0)
_GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class Labelled:
    """One answer read from the model, with its gold option index (noul: 0 true, 1 false)."""

    kind: str
    probabilities: tuple[float, ...]
    gold: int


def _tempered_nll(logs: Sequence[Sequence[float]], golds: Sequence[int], temperature: float
                  ) -> float:
    """Mean of log sum_j exp(l_j / T) - l_y / T: the NLL of softmax(l / T)."""
    total = 0.0
    for lg, g in zip(logs, golds):
        scaled = [x / temperature for x in lg]
        top = max(scaled)
        total += top + math.log(math.fsum(math.exp(s - top) for s in scaled)) - scaled[g]
    return total / len(golds)


def fit_temperature(probs: Sequence[Sequence[float]], golds: Sequence[int]) -> float:
    """argmin over T in T_RANGE of NLL(softmax(log p / T)), by golden-section search on
    log T (the NLL is convex in 1/T, hence unimodal in log T)."""
    logs = [[math.log(max(p, PROBABILITY_FLOOR)) for p in row] for row in probs]
    lo, hi = math.log(T_RANGE[0]), math.log(T_RANGE[1])
    c, d = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    fc, fd = _tempered_nll(logs, golds, math.exp(c)), _tempered_nll(logs, golds, math.exp(d))
    while hi - lo > 1e-7:
        if fc <= fd:
            hi, d, fd = d, c, fc
            c = hi - _GOLDEN * (hi - lo)
            fc = _tempered_nll(logs, golds, math.exp(c))
        else:
            lo, c, fc = c, d, fd
            d = lo + _GOLDEN * (hi - lo)
            fd = _tempered_nll(logs, golds, math.exp(d))
    return math.exp((lo + hi) / 2)


def _platt_loss(xs: Sequence[float], ts: Sequence[float], a: float, b: float) -> float:
    loss = 0.0
    for x, t in zip(xs, ts):
        z = a * x + b  # -[t log s + (1-t) log(1-s)] = log(1 + e^z) - t z
        loss += (z if z > 0 else 0.0) + math.log1p(math.exp(-abs(z))) - t * z
    return loss


def fit_platt(p_true: Sequence[float], is_true: Sequence[bool]) -> tuple[float, float]:
    """(a, b) minimising the NLL of sigmoid(a * logit(p) + b), by Newton's method with
    backtracking. Targets are Platt's smoothed labels, (N+ + 1)/(N+ + 2) for true and
    1/(N- + 2) for false, so separable data still gives finite parameters."""
    n_pos = sum(bool(y) for y in is_true)
    n_neg = len(is_true) - n_pos
    ts = [(n_pos + 1) / (n_pos + 2) if y else 1 / (n_neg + 2) for y in is_true]
    xs = [logit(p) for p in p_true]
    a, b = 1.0, 0.0
    loss = _platt_loss(xs, ts, a, b)
    for _ in range(100):
        ga = gb = haa = hab = hbb = 0.0
        for x, t in zip(xs, ts):
            s = sigmoid(a * x + b)
            w = s * (1 - s)
            ga, gb = ga + (s - t) * x, gb + (s - t)
            haa, hab, hbb = haa + w * x * x, hab + w * x, hbb + w
        haa, hbb = haa + 1e-12, hbb + 1e-12
        det = haa * hbb - hab * hab
        if det <= 0:
            break
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        step = 1.0
        while step > 1e-10:
            new = _platt_loss(xs, ts, a - step * da, b - step * db)
            if new <= loss:
                break
            step /= 2
        else:
            break
        a, b = a - step * da, b - step * db
        improvement, loss = loss - new, new
        if improvement < 1e-12 * max(1.0, loss):
            break
    return a, b


def fit_isotonic(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """Pool-adjacent-violators: the non-decreasing step function closest to ys in squared
    error (equal xs first pooled into one point), returned as knots (mean x, mean y) of
    its blocks."""
    points: list[list[float]] = []  # [x, sum y, count], one per distinct x
    for x, y in sorted(zip(xs, ys)):
        if points and points[-1][0] == x:
            points[-1][1] += y
            points[-1][2] += 1
        else:
            points.append([x, float(y), 1.0])
    blocks: list[list[float]] = []  # [sum count*x, sum y, count]
    for x, sy, n in points:
        blocks.append([x * n, sy, n])
        while len(blocks) > 1 and blocks[-2][1] / blocks[-2][2] > blocks[-1][1] / blocks[-1][2]:
            bx, by, bn = blocks.pop()
            blocks[-1][0] += bx
            blocks[-1][1] += by
            blocks[-1][2] += bn
    return [b[0] / b[2] for b in blocks], [b[1] / b[2] for b in blocks]


def fit_method(method: str, kind: str, probs: Sequence[Sequence[float]], golds: Sequence[int]
               ) -> dict[str, Any]:
    """The parameters of one method fitted on these answers (see transform.py for their use)."""
    if method == "none":
        return {}
    if method == "temperature":
        return {"temperature": fit_temperature(probs, golds)}
    if method == "platt":
        if kind != "noul":
            raise ValueError("Platt scaling is for noul questions only")
        a, b = fit_platt([p[0] for p in probs], [g == 0 for g in golds])
        return {"a": a, "b": b}
    if method == "isotonic":
        if kind == "noul":
            xs, ys = [p[0] for p in probs], [float(g == 0) for g in golds]
        else:
            xs = [top_probability(p) for p in probs]
            ys = [float(top_index(p) == g) for p, g in zip(probs, golds)]
        kx, ky = fit_isotonic(xs, ys)
        return {"x": kx, "y": ky}
    raise ValueError(f"unknown calibration method {method!r}")


def fold_ids(n: int, k: int, seed: int) -> list[int]:
    """Fold of each of n items: a seeded shuffle dealt round-robin into k folds."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    folds = [0] * n
    for position, item in enumerate(order):
        folds[item] = position % k
    return folds


def held_out(method: str, kind: str, probs: Sequence[Sequence[float]], golds: Sequence[int],
             folds: Sequence[int]) -> list[list[float]]:
    """Each answer calibrated by the method fitted on the other folds only."""
    out: list[list[float]] = [[] for _ in probs]
    for f in sorted(set(folds)):
        train = [i for i, fi in enumerate(folds) if fi != f]
        params = fit_method(method, kind, [probs[i] for i in train], [golds[i] for i in train])
        for i, fi in enumerate(folds):
            if fi == f:
                out[i] = calibrate(method, params, kind, probs[i])
    return out


@dataclass(frozen=True)
class KindFit:
    kind: str
    method: str
    params: dict[str, Any]
    n: int
    held_out_nll: dict[str, float]  # per method tried, "none" the uncalibrated answers
    after: list[list[float]]  # held-out calibrated answers, item order
    note: str = ""


def fit_kind(kind: str, probs: Sequence[Sequence[float]], golds: Sequence[int],
             methods: Sequence[str], k: int, seed: int) -> KindFit:
    """Choose and fit the method for one question type (module docstring)."""
    raw = [list(p) for p in probs]
    if len(raw) < max(MIN_ITEMS, 2 * k):
        return KindFit(kind, "none", {}, len(raw), {}, raw,
                       f"too few items ({len(raw)}) to fit and hold out")
    folds = fold_ids(len(raw), k, seed)
    nll = {"none": negative_log_likelihood(raw, golds)}
    answers = {"none": raw}
    tried = [m for m in ("temperature", *EXTRA_METHODS) if m in methods]
    for method in tried:
        if method == "platt" and kind != "noul":
            continue
        answers[method] = held_out(method, kind, raw, golds, folds)
        nll[method] = negative_log_likelihood(answers[method], golds)
    ece = {m: expected_calibration_error(a, golds) for m, a in answers.items()}
    kept = [m for m in nll if m != "none" and nll[m] < nll["none"] and ece[m] <= ece["none"]
            and (m == "temperature" or "temperature" not in nll or nll[m] < nll["temperature"])]
    best = min(kept, key=lambda m: nll[m], default="none")
    params = fit_method(best, kind, raw, golds)
    note = "" if kept else "no method improved the held-out NLL without worsening the ECE"
    if best == "temperature" and not T_RANGE[0] * 1.01 < params["temperature"] < T_RANGE[1] / 1.01:
        note = ("temperature at the end of its range: the answers carry almost no signal"
                if params["temperature"] > 1 else "temperature at the end of its range")
    return KindFit(kind, best, params, len(raw), nll, answers[best], note)


@dataclass(frozen=True)
class ThresholdChoice:
    target_accuracy: float
    threshold: float | None  # None: no threshold reaches the target; route everything to review
    coverage: float
    accuracy: float | None
    count: int


def choose_threshold(probs: Sequence[Sequence[float]], golds: Sequence[int], target: float,
                     min_count: int = MIN_AUTOMATED) -> ThresholdChoice:
    """The smallest top probability t such that the (at least ``min_count``) answers at or
    above it reach ``target`` accuracy."""
    for point in coverage_curve(probs, golds):
        if point.accuracy >= target and point.count >= min_count:
            return ThresholdChoice(target, point.threshold, point.coverage, point.accuracy,
                                   point.count)
    return ThresholdChoice(target, None, 0.0, None, 0)


@dataclass(frozen=True)
class CalibrationFit:
    kinds: dict[str, KindFit]
    threshold: ThresholdChoice
    golds: list[int]
    before: list[list[float]]  # the answers as read, item order
    after: list[list[float]]  # held-out calibrated answers, item order
    item_kinds: list[str] = field(default_factory=list)

    def metrics(self, which: str) -> dict[str, dict[str, float]]:
        """Summaries ("before" or "after") for all items and per question type."""
        probs = self.before if which == "before" else self.after
        out = {"all": summary(probs, self.golds)}
        for kind in self.kinds:
            idx = [i for i, k in enumerate(self.item_kinds) if k == kind]
            out[kind] = summary([probs[i] for i in idx], [self.golds[i] for i in idx])
        return out


def fit_calibration(items: Sequence[Labelled], *, methods: Sequence[str] = ("temperature",
                    "platt", "isotonic"), folds: int = 5, seed: int = 0,
                    target_accuracy: float = 0.95, min_automated: int = MIN_AUTOMATED
                    ) -> CalibrationFit:
    """Fit every question type present, then choose the threshold on the held-out answers."""
    if folds < 2:
        raise ValueError("cross-validation needs at least 2 folds")
    unknown = set(methods) - {"temperature", *EXTRA_METHODS}
    if unknown:
        raise ValueError(f"unknown calibration methods {sorted(unknown)}")
    if not items:
        raise ValueError("no labelled items")
    kinds: dict[str, KindFit] = {}
    after: list[list[float]] = [[] for _ in items]
    for kind in KINDS:
        idx = [i for i, item in enumerate(items) if item.kind == kind]
        if not idx:
            continue
        fit = fit_kind(kind, [items[i].probabilities for i in idx], [items[i].gold for i in idx],
                       methods, folds, seed)
        kinds[kind] = fit
        for j, i in enumerate(idx):
            after[i] = fit.after[j]
    golds = [item.gold for item in items]
    threshold = choose_threshold(after, golds, target_accuracy, min_automated)
    return CalibrationFit(kinds, threshold, golds,
                          [list(item.probabilities) for item in items], after,
                          [item.kind for item in items])
