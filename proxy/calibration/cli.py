"""``python -m proxy.calibration DATA.jsonl --profile NAME``: read, fit, write profile and report.

Three steps, each its own function so tests can run them apart:
``read_answers`` (read.py, HTTP), ``fit_profile`` (pure), ``report.write_report`` (files).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..decision.prompt import PROMPT_FORMAT_VERSION
from .dataset import DataError, data_sha256, load_items
from .fit import EXTRA_METHODS, MIN_AUTOMATED, CalibrationFit, Labelled, fit_calibration
from .profile import DEFAULT_DIR, KindCalibration, Profile, Threshold, profile_path, save
from .read import Progress, ReadError, Reading, read_answers, served_model

__all__ = ["Fitted", "build_parser", "fit_profile", "prompt_format_of", "main"]


@dataclass(frozen=True)
class Fitted:
    profile: Profile
    fit: CalibrationFit  # the fit the profile holds (on debiased reads when debias is set)
    plain: CalibrationFit | None = None  # the fit on plain reads, when debiasing was compared


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m proxy calibrate",
        description="Fit a calibration profile on labelled System One requests read through a "
                    "running proxy, and write the profile and a report.")
    p.add_argument("data", nargs="+", type=Path, help="JSONL files: one System One request with "
                   "one question and a top-level \"gold\" per line")
    p.add_argument("--profile", required=True, help="profile name ([A-Za-z0-9_.-]+)")
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the running proxy")
    p.add_argument("--api-key", default=None, help="bearer key for the proxy")
    p.add_argument("--target-accuracy", type=float, default=0.95,
                   help="accuracy the automated answers must reach (default 0.95)")
    p.add_argument("--min-automated", type=int, default=MIN_AUTOMATED,
                   help="fewest held-out answers a threshold must be backed by "
                        f"(default {MIN_AUTOMATED})")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fold assignment")
    p.add_argument("--debias", choices=["cyclic"], default=None,
                   help="also read with cyclic debiasing, fit on those reads and compare")
    p.add_argument("--methods", default="temperature,platt,isotonic",
                   help="comma-separated methods to try (default temperature,platt,isotonic)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_DIR,
                   help=f"where the profile and report go (default {DEFAULT_DIR})")
    p.add_argument("--limit", type=int, default=None, help="use only the first N items")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    return p


def prompt_format_of(readings: Sequence[Reading]) -> str:
    """The prompt format version the proxy reported; all answers must agree."""
    versions = {r.prompt_format_version for r in readings if r.prompt_format_version}
    if len(versions) > 1:
        raise ReadError(f"the proxy answered in several prompt formats: {sorted(versions)}")
    return versions.pop() if versions else PROMPT_FORMAT_VERSION


def fit_profile(
    readings: Sequence[Labelled], *, name: str, model: str, prompt_format_version: str,
    data_sha256: str, target_accuracy: float = 0.95, min_automated: int = MIN_AUTOMATED,
    folds: int = 5, seed: int = 0,
    methods: Sequence[str] = ("temperature", *EXTRA_METHODS), debias: str | None = None,
    plain: Sequence[Labelled] | None = None, created: str | None = None, llama_build: str = "",
) -> Fitted:
    """Fit on ``readings`` (the debiased ones when ``debias`` is set; ``plain`` then holds the
    same items read without debiasing, fitted on the same folds for the report)."""
    fit = fit_calibration(readings, methods=methods, folds=folds, seed=seed,
                          target_accuracy=target_accuracy, min_automated=min_automated)
    plain_fit = None
    if plain is not None:
        plain_fit = fit_calibration(plain, methods=methods, folds=folds, seed=seed,
                                    target_accuracy=target_accuracy, min_automated=min_automated)
    chosen = fit.threshold
    metrics = {"before": fit.metrics("before"), "after": fit.metrics("after"),
               "held_out_nll": {k: kf.held_out_nll for k, kf in fit.kinds.items()}}
    if plain_fit is not None:
        metrics["without_debias"] = {"before": plain_fit.metrics("before"),
                                     "after": plain_fit.metrics("after")}
    profile = Profile(
        name=name, model=model, prompt_format_version=prompt_format_version,
        created=created or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        data_sha256=data_sha256,
        calibration={k: KindCalibration(kf.method, kf.params, kf.n) for k, kf in fit.kinds.items()},
        threshold=Threshold(target_accuracy, chosen.threshold, chosen.coverage, chosen.accuracy,
                            chosen.count, min_automated),
        debias=debias, n_items=len(readings), folds=folds, seed=seed, metrics=metrics,
        llama_build=llama_build,
    )
    return Fitted(profile, fit, plain_fit)


def _methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = set(methods) - {"temperature", *EXTRA_METHODS}
    if unknown or not methods:
        raise ValueError(f"--methods takes temperature, platt, isotonic; got {text!r}")
    return methods


def _read(items, args, debias: str | None) -> list[Reading]:
    label = "reading (cyclic)" if debias else "reading"
    bar = Progress(len(items), label)
    return read_answers(items, args.url, api_key=args.api_key, debias=debias,
                        concurrency=args.concurrency, progress=bar.update)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .report import write_report  # matplotlib only when a report is written

    try:
        profile_path(args.profile, args.out_dir)
        methods = _methods(args.methods)
        if not 0 < args.target_accuracy <= 1 or args.folds < 2:
            raise ValueError("--target-accuracy must be in (0, 1] and --folds at least 2")
        items = load_items(args.data, args.limit)
        model, build = served_model(args.url, args.api_key)
        plain = _read(items, args, None)
        debiased = _read(items, args, args.debias) if args.debias else None
        fitted = fit_profile(
            [r.labelled for r in (debiased or plain)], name=args.profile, model=model,
            prompt_format_version=prompt_format_of([*plain, *(debiased or [])]),
            data_sha256=data_sha256(args.data), target_accuracy=args.target_accuracy,
            min_automated=args.min_automated,
            folds=args.folds, seed=args.seed, methods=methods, debias=args.debias,
            plain=[r.labelled for r in plain] if debiased else None, llama_build=build)
    except (ValueError, ReadError, OSError) as exc:  # DataError and ProfileError are ValueErrors
        kind = "data" if isinstance(exc, DataError) else "error"
        print(f"calibrate: {kind}: {exc}", file=sys.stderr)
        return 2
    path = save(fitted.profile, args.out_dir)
    paths = write_report(args.out_dir, fitted.profile, fitted.fit, fitted.plain)
    _summarise(fitted, path, paths)
    return 0


def _summarise(fitted: Fitted, path: Path, paths: dict[str, Path]) -> None:
    before, after = fitted.fit.metrics("before")["all"], fitted.fit.metrics("after")["all"]
    for kind, kf in fitted.fit.kinds.items():
        params = kf.params if kf.method != "isotonic" else f"{len(kf.params['x'])} knots"
        note = f" ({kf.note})" if kf.note else ""
        print(f"{kind}: {kf.n} items, method {kf.method} {params or ''}{note}")
    print("held out, before -> after: " + ", ".join(
        f"{m} {before[m]:.4f} -> {after[m]:.4f}" for m in ("accuracy", "ece", "brier", "nll")))
    t = fitted.profile.threshold
    print(f"threshold for accuracy {t.target_accuracy:g}: "
          + ("not reached (null; everything goes to review)" if t.threshold is None
             else f"{t.threshold:.4f}, coverage {t.coverage:.1%}"))
    print(f"wrote {path}, {', '.join(str(p) for p in paths.values())}")
