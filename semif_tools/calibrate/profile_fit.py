"""The profile a fit makes, shared by calibrate's two ways of fitting: reading labelled data
through a running proxy (cli.py) and decision records with their outcomes (from_records.py).

``check_settings`` and ``parse_methods`` refuse flags no fit can use, ``fit_profile`` fits
the maps, floor and threshold (fit.py) and makes the ``Profile`` the proxy serves, and
``summarise`` prints what was fitted and written.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.calibration.profile import KindCalibration, Profile, Threshold

from ..drift import fit_distributions
from .fit import (
    EXTRA_METHODS,
    MIN_AUTOMATED,
    TEST_SHARE,
    THRESHOLD_SHARE,
    CalibrationFit,
    Labelled,
    fit_calibration,
)
from .stats import DEFAULT_LEVEL, Interval

__all__ = ["Priors", "Fitted", "check_settings", "parse_methods", "fit_profile", "summarise"]

# PriDe's position prior per question type and option count (the profile's position_prior)
Priors = dict[str, dict[int, tuple[float, ...]]]


@dataclass(frozen=True)
class Fitted:
    """A fitted profile and the fits behind it (the report draws both)."""

    profile: Profile
    fit: CalibrationFit  # the fit the profile holds (on debiased reads when debias is set)
    plain: CalibrationFit | None = None  # the fit on plain reads, when debiasing was compared


def check_settings(args: argparse.Namespace) -> None:
    """Refuse the fit settings no fit can use (ValueError, naming the flag)."""
    if not 0 < args.target_accuracy <= 1 or args.folds < 2:
        raise ValueError("--target-accuracy must be in (0, 1] and --folds at least 2")
    if (
        not all(0 < x < 1 for x in (args.level, args.test_share, args.threshold_share))
        or not 0 < args.prior_sample <= 1
    ):
        raise ValueError(
            "--level, --test-share and --threshold-share must be within (0, 1), "
            "--prior-sample within (0, 1]"
        )
    if args.label_mass_floor is not None and not 0 <= args.label_mass_floor <= 1:
        raise ValueError("--label-mass-floor must be within [0, 1]")


def parse_methods(text: str) -> list[str]:
    """``--methods``: the comma-separated calibration maps to try."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = set(methods) - {"temperature", *EXTRA_METHODS}
    if unknown or not methods:
        raise ValueError(f"--methods takes temperature, platt, isotonic; got {text!r}")
    return methods


def _interval(ci: Interval) -> dict[str, float]:
    return {"value": ci.value, "low": ci.low, "high": ci.high, "n": ci.n}


def _figures(fit: CalibrationFit) -> dict[str, Any]:
    """The held-out test split's metrics with their intervals, as the profile stores them."""
    return {
        which: {
            scope: {m: _interval(ci) for m, ci in metrics.items()}
            for scope, metrics in fit.intervals(which).items()
        }
        for which in ("before", "after")
    }


def fit_profile(
    readings: Sequence[Labelled],
    *,
    name: str,
    model: str,
    prompt_format_version: str,
    data_sha256: str,
    target_accuracy: float = 0.95,
    min_automated: int = MIN_AUTOMATED,
    folds: int = 5,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
    test_share: float = TEST_SHARE,
    threshold_share: float = THRESHOLD_SHARE,
    label_mass_floor: float | None = None,
    methods: Sequence[str] = ("temperature", *EXTRA_METHODS),
    debias: str | None = None,
    plain: Sequence[Labelled] | None = None,
    created: str | None = None,
    llama_build: str = "",
    position_prior: Priors | None = None,
    read_scheme: str = "",
) -> Fitted:
    """Fit on ``readings`` (the debiased ones when ``debias`` is set; ``plain`` then holds the
    same items read without debiasing, fitted on the same split and folds for the report)."""
    settings = dict(
        methods=methods,
        folds=folds,
        seed=seed,
        target_accuracy=target_accuracy,
        min_automated=min_automated,
        level=level,
        test_share=test_share,
        threshold_share=threshold_share,
        label_mass_floor=label_mass_floor,
    )
    fit = fit_calibration(readings, **settings)
    plain_fit = fit_calibration(plain, **settings) if plain is not None else None
    chosen = fit.threshold
    metrics: dict[str, Any] = {
        "evaluation": fit.evaluation(),
        **_figures(fit),
        "cross_validated_nll": {k: kf.held_out_nll for k, kf in fit.kinds.items()},
        "distributions": fit_distributions(fit),  # the drift report's reference
    }
    if plain_fit is not None:
        metrics["without_debias"] = _figures(plain_fit)
    source = (
        f"threshold split: {len(fit.indices('threshold'))} items held out from the maps, "
        "calibrated by the profile's maps, those at or above the label-mass floor"
    )
    profile = Profile(
        name=name,
        model=model,
        prompt_format_version=prompt_format_version,
        created=created or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        data_sha256=data_sha256,
        calibration={k: KindCalibration(kf.method, kf.params, kf.n) for k, kf in fit.kinds.items()},
        threshold=Threshold(
            target_accuracy,
            chosen.threshold,
            chosen.coverage,
            chosen.accuracy,
            chosen.count,
            min_automated,
            level,
            chosen.lower_bound,
            source,
            fit.threshold_on_test(),
        ),
        debias=debias,
        n_items=len(readings),
        folds=folds,
        seed=seed,
        metrics=metrics,
        llama_build=llama_build,
        label_mass_floor=fit.label_mass_floor,
        position_prior=position_prior or {},
        read_scheme=read_scheme,
    )
    return Fitted(profile, fit, plain_fit)


def summarise(fitted: Fitted, path: Path, paths: dict[str, Path]) -> None:
    """What was fitted and written, printed: the maps, the held-out figures, the floor and the
    threshold."""
    fit = fitted.fit
    for kind, kf in fit.kinds.items():
        params = kf.params if kf.method != "isotonic" else f"{len(kf.params['x'])} knots"
        note = f" ({kf.note})" if kf.note else ""
        print(f"{kind}: {kf.n} items fitted, method {kf.method} {params or ''}{note}")
    before, after = fit.intervals("before")["all"], fit.intervals("after")["all"]
    print(
        f"held-out test split (n={before['accuracy'].n}; maps fitted on "
        f"{len(fit.indices('fit'))} items, threshold tested on "
        f"{len(fit.indices('threshold'))}), before -> after "
        f"[{fit.level:.0%} bootstrap interval]: "
        + ", ".join(
            f"{m} {before[m].value:.4f} -> {after[m].value:.4f} "
            f"[{after[m].low:.4f}, {after[m].high:.4f}]"
            for m in ("accuracy", "ece", "brier", "nll")
        )
    )
    t = fitted.profile.threshold
    print(
        f"label-mass floor {fitted.profile.label_mass_floor:.4f}: diverts "
        f"{t.test['below_floor']} of {t.test['n']} test answers"
    )
    if t.threshold is None:
        print(
            f"threshold for accuracy {t.target_accuracy:g}: none passed the fixed-sequence "
            f"test at level {t.level:g} (null; everything goes to review)"
        )
    else:
        print(
            f"threshold for accuracy {t.target_accuracy:g}: {t.threshold:.2f}, "
            f"lower bound {t.lower_bound:.4f}, coverage {t.coverage:.1%} of the threshold "
            "split; "
            f"on the test split {t.test['count']} of {t.test['n']} automated"
            + (
                f" at accuracy {t.test['accuracy']:.3f} (bound {t.test['lower_bound']:.3f})"
                if t.test["count"]
                else ""
            )
        )
    print(f"wrote {path}, {', '.join(str(p) for p in paths.values())}")
