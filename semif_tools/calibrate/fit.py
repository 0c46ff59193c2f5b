"""Fitting calibration on labelled answers, and figures the choices did not see.

The items are split first (seeded, within each question type and gold answer)
into three parts: a held-out *test* split (``test_share`` of them, 30% by
default), and of the rest a *threshold* split (``threshold_share``, 30%) and
the *fit* split. Each choice sees only its own part:

- For each question type, the fit split is cut into k folds; each candidate
  method is fitted on k-1 folds and applied to the fold left out, so every fit
  item gets a cross-validated answer. A method is kept only if its
  cross-validated NLL beats the uncalibrated answers and its ECE is no worse;
  Platt and isotonic must also beat plain temperature scaling on NLL when that
  was tried. The best kept method is fitted on the whole fit split: that map is
  what the profile holds, and it is never refitted.
- The label-mass floor is a low quantile of the label masses of the fit and
  threshold splits (label masses need no labels).
- The automation threshold is chosen by fixed-sequence testing (``stats.py``)
  on the threshold split's answers above the floor, calibrated by the profile's
  own maps, which were fitted without them: so the Clopper-Pearson bound is a
  bound for the map that is served.

The test split then gets the same maps applied, and every figure the report
gives as "held out" (before and after, the threshold's coverage and accuracy,
the answers the floor diverts) comes from it, with bootstrap intervals.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.calibration.transform import (
    PROBABILITY_FLOOR,
    apply_method,
    logit,
    sigmoid,
    top_index,
)

from .scores import (
    accuracy,
    brier_score,
    expected_calibration_error,
    negative_log_likelihood,
    summary,
    top_probability,
)
from .stats import (
    DEFAULT_LEVEL,
    Interval,
    ThresholdTest,
    bootstrap_interval,
    clopper_pearson_lower,
    fixed_sequence_threshold,
    quantile,
)

__all__ = [
    "KINDS",
    "EXTRA_METHODS",
    "MIN_ITEMS",
    "MIN_AUTOMATED",
    "T_RANGE",
    "Labelled",
    "KindFit",
    "TEST_SHARE",
    "THRESHOLD_SHARE",
    "ROLES",
    "FLOOR_QUANTILE",
    "FLOOR_CAP",
    "CalibrationFit",
    "fit_temperature",
    "fit_platt",
    "fit_isotonic",
    "fit_method",
    "fold_ids",
    "held_out",
    "fit_kind",
    "split_roles",
    "assign_roles",
    "fit_label_mass_floor",
    "fit_calibration",
]

KINDS = ("choice", "score", "noul")
EXTRA_METHODS = ("platt", "isotonic")
MIN_ITEMS = 10  # fewer items of a type than this (or than 2 per fold): left uncalibrated
MIN_AUTOMATED = 10  # a threshold must be backed by at least this many held-out answers
TEST_SHARE = 0.3  # items held out for the report, seen by no choice
THRESHOLD_SHARE = 0.3  # of the other items: held out from the maps, to test thresholds on
FLOOR_QUANTILE = 0.05  # the default label-mass floor: this quantile of the fit split's ...
FLOOR_CAP = 0.5  # ... but never above this
T_RANGE = (0.01, 100.0)
_GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class Labelled:
    """One answer read from the model, with its gold option index (noul: 0 true, 1 false)."""

    kind: str
    probabilities: tuple[float, ...]
    gold: int
    label_mass: float | None = None  # the labels' raw probability mass, when read


def _tempered_nll(
    logs: Sequence[Sequence[float]], golds: Sequence[int], temperature: float
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


def fit_method(
    method: str, kind: str, probs: Sequence[Sequence[float]], golds: Sequence[int]
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


def held_out(
    method: str,
    kind: str,
    probs: Sequence[Sequence[float]],
    golds: Sequence[int],
    folds: Sequence[int],
) -> list[list[float]]:
    """Each answer calibrated by the method fitted on the other folds only."""
    out: list[list[float]] = [[] for _ in probs]
    for f in sorted(set(folds)):
        train = [i for i, fi in enumerate(folds) if fi != f]
        params = fit_method(method, kind, [probs[i] for i in train], [golds[i] for i in train])
        for i, fi in enumerate(folds):
            if fi == f:
                out[i] = apply_method(method, params, kind, probs[i])
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


def fit_kind(
    kind: str,
    probs: Sequence[Sequence[float]],
    golds: Sequence[int],
    methods: Sequence[str],
    k: int,
    seed: int,
) -> KindFit:
    """Choose and fit the method for one question type (module docstring)."""
    raw = [list(p) for p in probs]
    if len(raw) < max(MIN_ITEMS, 2 * k):
        return KindFit(
            kind, "none", {}, len(raw), {}, raw, f"too few items ({len(raw)}) to fit and hold out"
        )
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
    kept = [
        m
        for m in nll
        if m != "none"
        and nll[m] < nll["none"]
        and ece[m] <= ece["none"]
        and (m == "temperature" or "temperature" not in nll or nll[m] < nll["temperature"])
    ]
    best = min(kept, key=lambda m: nll[m], default="none")
    params = fit_method(best, kind, raw, golds)
    note = "" if kept else "no method improved the held-out NLL without worsening the ECE"
    if best == "temperature" and not T_RANGE[0] * 1.01 < params["temperature"] < T_RANGE[1] / 1.01:
        note = (
            "temperature at the end of its range: the answers carry almost no signal"
            if params["temperature"] > 1
            else "temperature at the end of its range"
        )
    return KindFit(kind, best, params, len(raw), nll, answers[best], note)


def split_roles(items: Sequence[Labelled], test_share: float, seed: int) -> list[bool]:
    """Which items are held out for testing: within each (question type, gold answer) group,
    a seeded shuffle, of which the first round(test_share * size) go to the test split."""
    if not 0 < test_share < 1:
        raise ValueError("test_share must be within (0, 1)")
    groups: dict[tuple[str, int], list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault((item.kind, item.gold), []).append(i)
    is_test = [False] * len(items)
    rng = random.Random(seed)
    for key in sorted(groups):
        members = groups[key]
        rng.shuffle(members)
        for i in members[: round(test_share * len(members))]:
            is_test[i] = True
    return is_test


ROLES = ("fit", "threshold", "test")


def assign_roles(
    items: Sequence[Labelled], test_share: float, threshold_share: float, seed: int
) -> list[str]:
    """Each item's part: "test" by ``split_roles(items, test_share, seed)``; of the others,
    "threshold" by ``split_roles(others, threshold_share, seed + 1)``; the rest "fit"."""
    is_test = split_roles(items, test_share, seed)
    others = [i for i, t in enumerate(is_test) if not t]
    is_threshold = split_roles([items[i] for i in others], threshold_share, seed + 1)
    roles = ["test" if t else "fit" for t in is_test]
    for i, t in zip(others, is_threshold):
        if t:
            roles[i] = "threshold"
    return roles


def fit_label_mass_floor(masses: Sequence[float]) -> float:
    """The default floor: min(FLOOR_CAP, the FLOOR_QUANTILE-quantile of the label masses)
    (0 when none is known): an answer below it gave the labels less of the model's
    probability than 19 in 20 labelled answers did, and less than half of it."""
    return min(FLOOR_CAP, quantile(masses, FLOOR_QUANTILE)) if masses else 0.0


def _above_floor(mass: float | None, floor: float) -> bool:
    return mass is None or mass >= floor


@dataclass(frozen=True)
class CalibrationFit:
    kinds: dict[str, KindFit]  # maps fitted on the fit split
    threshold: ThresholdTest  # fixed-sequence test on the threshold split
    golds: list[int]
    before: list[list[float]]  # the answers as read, item order
    after: list[list[float]]  # fit split: cross-validated; the others: the fitted maps applied
    item_kinds: list[str]
    roles: list[str]  # ROLES, item order
    label_masses: list[float | None]
    label_mass_floor: float
    level: float = DEFAULT_LEVEL
    seed: int = 0

    @property
    def is_test(self) -> list[bool]:
        return [r == "test" for r in self.roles]

    def indices(self, part: str = "test") -> list[int]:
        """The items of one part ("fit", "threshold", "test") or of all ("all")."""
        return [i for i, r in enumerate(self.roles) if part in ("all", r)]

    def evaluation(self) -> str:
        """Where the reported figures come from, in words (the report and the profile)."""
        n = {part: len(self.indices(part)) for part in ROLES}
        return (
            f"held-out test split: {n['test']} items (seed {self.seed}) that neither the "
            "choice of method, the maps, the label-mass floor nor the threshold saw; the "
            f"maps were chosen and fitted on {n['fit']} items, the threshold tested on "
            f"{n['threshold']} others. Intervals: {self.level:.0%} percentile bootstrap "
            "over the test items."
        )

    def _scopes(self, part: str) -> dict[str, list[int]]:
        idx = self.indices(part)
        scopes = {"all": idx}
        for kind in self.kinds:
            scopes[kind] = [i for i in idx if self.item_kinds[i] == kind]
        return {scope: members for scope, members in scopes.items() if members}

    def metrics(self, which: str, part: str = "test") -> dict[str, dict[str, float]]:
        """Summaries ("before" or "after") of one split, for all items and per question type."""
        probs = self.before if which == "before" else self.after
        return {
            scope: summary([probs[i] for i in idx], [self.golds[i] for i in idx])
            for scope, idx in self._scopes(part).items()
        }

    def intervals(self, which: str, part: str = "test") -> dict[str, dict[str, Interval]]:
        """Every metric of ``metrics`` with its bootstrap interval over the scope's items."""
        probs = self.before if which == "before" else self.after
        out: dict[str, dict[str, Interval]] = {}
        for scope, idx in self._scopes(part).items():
            rows, golds = [probs[i] for i in idx], [self.golds[i] for i in idx]
            out[scope] = {
                name: bootstrap_interval(
                    _on_resample(f, rows, golds), len(idx), level=self.level, seed=self.seed
                )
                for name, f in _METRICS.items()
            }
        return out

    def threshold_on_test(self) -> dict[str, Any]:
        """The stored threshold (and floor) applied to the test split: what automating would
        have done on answers nothing was chosen on, with a Clopper-Pearson bound."""
        idx = self.indices("test")
        floor = self.label_mass_floor
        diverted = [i for i in idx if not _above_floor(self.label_masses[i], floor)]
        out: dict[str, Any] = {"n": len(idx), "below_floor": len(diverted)}
        if diverted:
            out["below_floor_accuracy"] = sum(
                top_index(self.after[i]) == self.golds[i] for i in diverted
            ) / len(diverted)
        t = self.threshold.threshold
        if t is None or not idx:
            return {**out, "count": 0, "coverage": 0.0, "accuracy": None, "lower_bound": None}
        kept = set(idx) - set(diverted)
        picked = [i for i in idx if i in kept and top_probability(self.after[i]) >= t]
        right = sum(top_index(self.after[i]) == self.golds[i] for i in picked)
        return {
            **out,
            "count": len(picked),
            "coverage": len(picked) / len(idx),
            "accuracy": right / len(picked) if picked else None,
            "lower_bound": clopper_pearson_lower(right, len(picked), self.level)
            if picked
            else None,
        }


_METRICS = {
    "accuracy": accuracy,
    "ece": expected_calibration_error,
    "brier": brier_score,
    "nll": negative_log_likelihood,
}


def _on_resample(
    metric: Callable[[Sequence[Sequence[float]], Sequence[int]], float],
    rows: Sequence[Sequence[float]],
    golds: Sequence[int],
) -> Callable[[Sequence[int]], float]:
    """``metric`` of the answers a bootstrap resample picks (indices into rows and golds)."""
    return lambda pick: metric([rows[j] for j in pick], [golds[j] for j in pick])


def fit_calibration(
    items: Sequence[Labelled],
    *,
    methods: Sequence[str] = ("temperature", "platt", "isotonic"),
    folds: int = 5,
    seed: int = 0,
    target_accuracy: float = 0.95,
    min_automated: int = MIN_AUTOMATED,
    level: float = DEFAULT_LEVEL,
    test_share: float = TEST_SHARE,
    threshold_share: float = THRESHOLD_SHARE,
    label_mass_floor: float | None = None,
) -> CalibrationFit:
    """Split, fit every question type present on the fit split, choose the floor (unless
    given), test thresholds on the threshold split and apply the maps to the test split
    (module docstring)."""
    if folds < 2:
        raise ValueError("cross-validation needs at least 2 folds")
    unknown = set(methods) - {"temperature", *EXTRA_METHODS}
    if unknown:
        raise ValueError(f"unknown calibration methods {sorted(unknown)}")
    if not items:
        raise ValueError("no labelled items")
    roles = assign_roles(items, test_share, threshold_share, seed)
    if "test" not in roles:
        raise ValueError(
            f"{len(items)} items are too few to hold out a test split of "
            f"{test_share:g}: add items or raise --test-share"
        )
    kinds: dict[str, KindFit] = {}
    after: list[list[float]] = [[] for _ in items]
    for kind in KINDS:
        train = [i for i, item in enumerate(items) if item.kind == kind and roles[i] == "fit"]
        others = [i for i, item in enumerate(items) if item.kind == kind and roles[i] != "fit"]
        if not train and not others:
            continue
        fit = fit_kind(
            kind,
            [items[i].probabilities for i in train],
            [items[i].gold for i in train],
            methods,
            folds,
            seed,
        )
        kinds[kind] = fit
        for j, i in enumerate(train):
            after[i] = fit.after[j]
        for i in others:
            after[i] = apply_method(fit.method, fit.params, kind, items[i].probabilities)
    masses = [item.label_mass for item in items]
    if label_mass_floor is None:
        label_mass_floor = fit_label_mass_floor(
            [m for m, r in zip(masses, roles) if r != "test" and m is not None]
        )
    judged = [i for i, r in enumerate(roles) if r == "threshold"]
    chosen = [i for i in judged if _above_floor(masses[i], label_mass_floor)]
    if chosen:
        threshold = fixed_sequence_threshold(
            [top_probability(after[i]) for i in chosen],
            [top_index(after[i]) == items[i].gold for i in chosen],
            target_accuracy,
            level=level,
            min_count=min_automated,
        )
        # the coverage of every threshold-split answer, the ones below the floor included
        threshold = replace(threshold, coverage=threshold.count / len(judged))
    else:
        threshold = ThresholdTest(target_accuracy, level, None, None, None, 0.0, 0, 0)
    return CalibrationFit(
        kinds,
        threshold,
        [item.gold for item in items],
        [list(item.probabilities) for item in items],
        after,
        [item.kind for item in items],
        roles,
        masses,
        label_mass_floor,
        level,
        seed,
    )
