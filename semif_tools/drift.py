"""The drift report's table: whether the calibration still holds, window by window (the
command, ``python -m semif_tools drift``: drift_cli.py; the page: drift_page.py).

Per time window (``--window``: ``30m``, ``12h``, ``1d``, ``1w``; windows start at multiples
of the width since 1970-01-01T00:00Z, so ``1d`` windows are UTC days):

- ``n``: decisions recorded; ``labelled``: those with an outcome.
- accuracy of the labelled decisions' choices, with a Wilson interval, and their ECE (10
  bins on the top probability, ``scores.py``) with a percentile-bootstrap interval.
- coverage: the share of routed decisions routed ``auto`` (Wilson interval); the review share
  is the rest. The automated labelled decisions' accuracy carries the one-sided
  Clopper-Pearson lower bound the threshold promised (``stats.py``).
- the label-mass and confidence (top probability) distributions in 10 equal bins on [0, 1],
  and their population stability index against a reference: the profile's stored fit
  distributions (``metrics.distributions``, written by calibrate) when ``--profile`` names a
  profile that has them, else the first window that has decisions.

With ``--profile``, every figure is of that profile applied to the records' raw
probabilities (its maps, floor and threshold: what it would have done); without it, of the
probabilities and routes as served. Nothing here chose anything: the figures of a window are
descriptions of that window, each with its sample size.

Outcomes are rarely a random sample: reviewers label what was routed to review. The table
says, per window, what share of the automated and of the reviewed decisions has an outcome;
the automated accuracy only means something when automated decisions are also sampled for
review.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from proxy.calibration.profile import Profile, apply, route, same_model
from proxy.calibration.transform import apply_method, top_index

from .calibrate.fit import KINDS, CalibrationFit
from .calibrate.scores import expected_calibration_error
from .calibrate.stats import (
    BOOTSTRAP_RESAMPLES,
    DEFAULT_LEVEL,
    Interval,
    bootstrap_interval,
    clopper_pearson_lower,
    wilson_interval,
)
from .record_files import AGREED, FITTED_APIS, Record

__all__ = [
    "BINS",
    "PSI_FLOOR",
    "Decision",
    "Window",
    "Drift",
    "parse_window",
    "histogram",
    "psi",
    "fit_distributions",
    "decisions",
    "drift_table",
]

BINS = 10  # equal-width bins on [0, 1] for label mass and confidence
PSI_FLOOR = 1e-4  # a bin's share below this counts as this in the PSI (an empty bin)
MAX_WINDOWS = 10_000
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def parse_window(text: str) -> dt.timedelta:
    """``<count><unit>``, unit m, h, d or w (minutes, hours, days, weeks)."""
    match = re.fullmatch(r"\s*(\d+)\s*([mhdw])\s*", text)
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"--window takes a count and a unit m, h, d or w (12h, 1d); got {text!r}")
    return dt.timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def histogram(values: Sequence[float], bins: int = BINS) -> list[int]:
    """Counts in ``bins`` equal-width bins on [0, 1]: bin i holds i/bins <= x < (i+1)/bins,
    the last one also x = 1 (values outside [0, 1] go to the end bins)."""
    counts = [0] * bins
    for x in values:
        counts[min(bins - 1, max(0, math.floor(x * bins)))] += 1
    return counts


def psi(actual: Sequence[int], expected: Sequence[int]) -> float | None:
    """Population stability index of the counts ``actual`` against ``expected`` (same bins):
    sum_i (a_i - e_i) ln(a_i / e_i) over the shares a_i, e_i, each at least PSI_FLOOR. None
    when either has no counts. Usual reading: below 0.1 stable, 0.1-0.25 a shift worth a look,
    above 0.25 a large one; with n values per side it is about (bins - 1)(1/n_a + 1/n_e) on
    average even without any shift (sampling noise)."""
    if len(actual) != len(expected):
        raise ValueError("the two histograms need the same bins")
    na, ne = sum(actual), sum(expected)
    if not na or not ne:
        return None
    total = 0.0
    for a, e in zip(actual, expected):
        pa, pe = max(a / na, PSI_FLOOR), max(e / ne, PSI_FLOOR)
        total += (pa - pe) * math.log(pa / pe)
    return total


def fit_distributions(fit: CalibrationFit) -> dict[str, Any]:
    """What the profile stores for drift: the label masses and the confidences (top
    probability after the profile's maps) of every item it was fitted on, as BINS counts."""
    confidences = []
    for kind, probs in zip(fit.item_kinds, fit.before):
        kf = fit.kinds[kind]
        confidences.append(max(apply_method(kf.method, kf.params, kind, probs)))
    masses = [m for m in fit.label_masses if m is not None]
    return {
        "bins": BINS,
        "label_mass": histogram(masses),
        "confidence": histogram(confidences),
        "n_label_mass": len(masses),
        "n_confidence": len(confidences),
        "source": "every item fitted on (all three splits); confidence: the top probability "
        "after the profile's maps",
    }


@dataclass(frozen=True)
class Decision:
    """One recorded decision as the report sees it."""

    time: dt.datetime
    probabilities: tuple[float, ...]  # calibrated by --profile, else as served
    label_mass: float | None
    route: str | None  # "auto", "review", or None (not routed)
    gold: int | None  # from its outcome
    agreed: tuple[str | None, ...]

    @property
    def confidence(self) -> float:
        return max(self.probabilities)

    @property
    def right(self) -> bool:
        return top_index(self.probabilities) == self.gold


def decisions(
    records: Sequence[Record], golds: dict[str, int], profile: Profile | None
) -> list[Decision]:
    """The question decisions (``FITTED_APIS``, choice/score/noul), with their outcome."""
    out = []
    for r in records:
        if r.api not in FITTED_APIS or r.question_type not in KINDS:
            continue
        if profile is None:
            probs, routed = r.probabilities, r.route
        else:
            probs = tuple(apply(profile, r.question_type, r.read()))
            mass = 1.0 if r.label_mass is None else r.label_mass
            routed = route(profile, probs, mass)[0]
        out.append(
            Decision(r.time, probs, r.label_mass, routed, golds.get(r.decision_id), r.agreed)
        )
    return out


@dataclass(frozen=True)
class Window:
    start: dt.datetime
    end: dt.datetime
    n: int
    labelled: int
    accuracy: Interval | None  # Wilson
    ece: Interval | None  # percentile bootstrap
    routed: int  # decisions with a route
    coverage: Interval | None  # share routed auto (Wilson)
    review_share: float | None
    automated_labelled: int
    automated_accuracy: float | None
    automated_lower_bound: float | None  # one-sided Clopper-Pearson at the level
    labelled_share_auto: float | None  # of the automated decisions, the share with an outcome
    labelled_share_review: float | None
    label_mass: list[int]  # histogram
    confidence: list[int]
    psi_label_mass: float | None
    psi_confidence: float | None
    values: dict[str, list[str]] = field(default_factory=dict)  # AGREED values seen
    # starts before --profile was created: may hold what it was fitted on (not held out)
    before_profile: bool = False


@dataclass(frozen=True)
class Drift:
    windows: list[Window]
    reference: str  # what the PSI compares with, in words
    reference_label_mass: list[int]
    reference_confidence: list[int]
    level: float
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        def encode(x: Any) -> Any:
            return x.isoformat().replace("+00:00", "Z") if isinstance(x, dt.datetime) else x

        rows = [{k: encode(v) for k, v in asdict(w).items()} for w in self.windows]
        return {**asdict(self), "windows": rows}


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _window(
    start: dt.datetime,
    width: dt.timedelta,
    ds: Sequence[Decision],
    level: float,
    seed: int,
    resamples: int,
) -> Window:
    labelled = [d for d in ds if d.gold is not None]
    right = sum(d.right for d in labelled)
    ece = None
    if labelled:
        rows, golds = [d.probabilities for d in labelled], [d.gold or 0 for d in labelled]
        ece = bootstrap_interval(
            lambda pick: expected_calibration_error(
                [rows[j] for j in pick], [golds[j] for j in pick]
            ),
            len(labelled),
            level=level,
            resamples=resamples,
            seed=seed,
        )
    routed = [d for d in ds if d.route is not None]
    auto = [d for d in routed if d.route == "auto"]
    review = [d for d in routed if d.route != "auto"]
    auto_labelled = [d for d in auto if d.gold is not None]
    auto_right = sum(d.right for d in auto_labelled)
    coverage = wilson_interval(len(auto), len(routed), level) if routed else None
    masses = [d.label_mass for d in ds if d.label_mass is not None]
    return Window(
        start,
        start + width,
        len(ds),
        len(labelled),
        wilson_interval(right, len(labelled), level) if labelled else None,
        ece,
        len(routed),
        coverage,
        None if coverage is None else 1 - coverage.value,
        len(auto_labelled),
        _share(auto_right, len(auto_labelled)),
        clopper_pearson_lower(auto_right, len(auto_labelled), level) if auto_labelled else None,
        _share(len(auto_labelled), len(auto)),
        _share(sum(d.gold is not None for d in review), len(review)),
        histogram(masses),
        histogram([d.confidence for d in ds]),
        None,
        None,
        {
            name: sorted({str(d.agreed[i]) for d in ds})
            for i, name in enumerate(AGREED)
            if name in ("model", "llama_build", "prompt_format_version")
        },
    )


def drift_table(
    ds: Sequence[Decision],
    width: dt.timedelta,
    *,
    profile: Profile | None = None,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Drift:
    """One ``Window`` per width from the first decision's window to the last one's (empty
    windows included, n = 0), and the PSI of each against the reference (module docstring)."""
    if not ds:
        raise ValueError("no decisions to report on")
    seconds = width.total_seconds()

    def slot(when: dt.datetime) -> int:
        return math.floor((when - _EPOCH).total_seconds() / seconds)

    slots: dict[int, list[Decision]] = {}
    for d in sorted(ds, key=lambda d: d.time):
        slots.setdefault(slot(d.time), []).append(d)
    first, last = min(slots), max(slots)
    if last - first >= MAX_WINDOWS:
        raise ValueError(f"{last - first + 1} windows of {width}: use a wider --window")
    windows = [
        _window(_EPOCH + k * width, width, slots.get(k, []), level, seed, resamples)
        for k in range(first, last + 1)
    ]
    stored = (profile.metrics.get("distributions") if profile is not None else None) or {}
    notes = []
    if stored.get("bins") == BINS:
        ref_mass, ref_conf = list(stored["label_mass"]), list(stored["confidence"])
        reference = (
            f"profile {profile.name if profile else ''}'s fit: {stored.get('n_confidence')} "
            f"items ({stored.get('source', '')})"
        )
    else:
        base = next(w for w in windows if w.n)
        ref_mass, ref_conf = base.label_mass, base.confidence
        reference = f"the first window, {_stamp(base.start)} (n={base.n})"
        if profile is not None:
            notes.append(
                f"profile {profile.name} stores no fit distributions (fitted before they were "
                "stored): the PSI compares with the first window"
            )
    if profile is not None:
        notes += _mismatches(ds, profile)
        created = _created(profile)
        if created is not None and windows[0].start < created:
            windows = [replace(w, before_profile=w.start < created) for w in windows]
            notes.append(
                f"windows marked * start before profile {profile.name} was created "
                f"({profile.created}): they may hold the decisions it was fitted on, so their "
                "figures are not held out; judge the profile on the windows after"
            )
    windows = [
        _with_psi(w, psi(w.label_mass, ref_mass), psi(w.confidence, ref_conf)) for w in windows
    ]
    return Drift(windows, reference, ref_mass, ref_conf, level, notes)


def _created(profile: Profile) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(profile.created.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def _mismatches(ds: Sequence[Decision], profile: Profile) -> list[str]:
    """Decisions read otherwise than the profile was fitted for (its maps may not fit them)."""
    wanted = {
        "model": profile.model,
        "prompt_format_version": profile.prompt_format_version,
        "debias": profile.debias,
    }
    notes = []
    for name, value in wanted.items():
        i = AGREED.index(name)
        if name == "model":
            off = sum(not same_model(profile.model, d.agreed[i] or "") for d in ds)
        else:
            off = sum(d.agreed[i] != value for d in ds)
        if off:
            notes.append(
                f"{off} of {len(ds)} decisions have another {name} than profile "
                f"{profile.name}'s {value!r}"
            )
    return notes


def _with_psi(w: Window, mass: float | None, conf: float | None) -> Window:
    return replace(w, psi_label_mass=mass, psi_confidence=conf)


def _stamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%MZ")
