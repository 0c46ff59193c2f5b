"""The calibration report: ``NAME.report.md``, ``NAME.reliability.png``, ``NAME.coverage.png``.

"Before" is the answers as read; "after" is each answer calibrated by the method
fitted on the other folds (held out). Figures are drawn with matplotlib's Agg
canvas directly (no pyplot, no display, no global state).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .fit import CalibrationFit
from .metrics import coverage_curve, position_shares, reliability_bins, top_index, top_probability
from .profile import Profile

__all__ = ["REPORT_THRESHOLDS", "report_paths", "write_report", "reliability_figure",
           "coverage_figure", "markdown"]

REPORT_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
_POSITIONS = "ABCDEFGHIJ"


def report_paths(out_dir: Path | str, name: str) -> dict[str, Path]:
    out = Path(out_dir)
    return {"report": out / f"{name}.report.md", "reliability": out / f"{name}.reliability.png",
            "coverage": out / f"{name}.coverage.png"}


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, metadata={"Software": None})


def reliability_figure(fit: CalibrationFit, path: Path) -> None:
    """Accuracy against mean top probability per bin, before and after, with bin counts."""
    fig = Figure(figsize=(7, 7))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect calibration")
    for label, probs, style, offset in (("before", fit.before, "o-", -0.012),
                                        ("after (held out)", fit.after, "s-", 0.012)):
        bins = [b for b in reliability_bins(probs, fit.golds) if b.count]
        line, = top.plot([b.confidence for b in bins], [b.accuracy for b in bins], style,
                         label=label)
        for b in bins:
            top.annotate(str(b.count), (b.confidence, b.accuracy), textcoords="offset points",
                         xytext=(0, 6), ha="center", fontsize=7, color=line.get_color())
        all_bins = reliability_bins(probs, fit.golds)
        bottom.bar([(b.lower + b.upper) / 2 + offset for b in all_bins],
                   [b.count for b in all_bins], width=0.022, color=line.get_color(), label=label)
    top.set(xlim=(0, 1), ylim=(0, 1.05), ylabel="accuracy in bin",
            title="Reliability (10 bins on the top probability; numbers are bin counts)")
    top.legend(loc="upper left", fontsize=8)
    bottom.set(xlabel="top probability", ylabel="answers")
    fig.tight_layout()
    _save(fig, path)


def coverage_figure(fit: CalibrationFit, path: Path, target: float, threshold: float | None
                    ) -> None:
    """Accuracy of the automated answers against the share automated, before and after."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for label, probs in (("before", fit.before), ("after (held out)", fit.after)):
        curve = coverage_curve(probs, fit.golds)[::-1]  # coverage ascending
        ax.plot([p.coverage for p in curve], [p.accuracy for p in curve], label=label)
    ax.axhline(target, color="0.5", linestyle=":", label=f"target accuracy {target:g}")
    if threshold is not None:
        chosen = fit.threshold
        ax.plot([chosen.coverage], [chosen.accuracy], "k*", markersize=10,
                label=f"threshold {threshold:.3f}: coverage {chosen.coverage:.0%}")
    ax.set(xlim=(0, 1.02), ylim=(0, 1.02), xlabel="coverage (share of answers automated)",
           ylabel="accuracy of automated answers",
           title="Coverage vs accuracy (automate answers at or above a threshold)")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _rows(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _at_threshold(probs: Sequence[Sequence[float]], golds: Sequence[int], t: float) -> list[str]:
    picked = [(p, g) for p, g in zip(probs, golds) if top_probability(p) >= t]
    acc = sum(top_index(p) == g for p, g in picked) / len(picked) if picked else None
    return [f"{len(picked) / len(golds):.1%} ({len(picked)})", _f(acc)]


def _position_section(plain: CalibrationFit, debiased: CalibrationFit) -> list[str]:
    width = min(len(_POSITIONS), max(len(p) for p in plain.before))
    rows = []
    for kind in plain.kinds:
        idx = [i for i, k in enumerate(plain.item_kinds) if k == kind]
        n = min(width, max(len(plain.before[i]) for i in idx))
        for label, positions in (
            ("gold answers", [plain.golds[i] for i in idx]),
            ("without debiasing", [top_index(plain.before[i]) for i in idx]),
            ("with cyclic debiasing", [top_index(debiased.before[i]) for i in idx]),
        ):
            shares = position_shares(positions, width)
            rows.append([kind, label, *(f"{x:.0%}" if j < n else "" for j, x in enumerate(shares))])
    lines = ["## Position bias", "",
             "Share of answers whose choice was shown at each position (noul: A is yes, B no).", "",
             *_rows(["type", "", *_POSITIONS[:width]], rows), "",
             "Same items, same held-out folds:", ""]
    metric_rows = []
    for label, fit in (("without debiasing", plain), ("with cyclic debiasing", debiased)):
        before, after = fit.metrics("before"), fit.metrics("after")
        for scope in before:
            b, a = before[scope], after[scope]
            metric_rows.append([scope, label, _f(b["accuracy"]), _f(a["accuracy"]), _f(b["ece"]),
                                _f(a["ece"]), _f(b["nll"]), _f(a["nll"])])
    return [*lines, *_rows(["scope", "reads", "accuracy raw", "accuracy calibrated", "ECE raw",
                            "ECE calibrated", "NLL raw", "NLL calibrated"], metric_rows), ""]


def markdown(profile: Profile, fit: CalibrationFit, paths: dict[str, Path],
             plain: CalibrationFit | None = None) -> str:
    t = profile.threshold
    lines = [f"# Calibration report: {profile.name}", "",
             f"- model: `{profile.model}`", f"- prompt format: `{profile.prompt_format_version}`",
             f"- data sha256: `{profile.data_sha256}` ({profile.n_items} items)",
             f"- created: {profile.created}; {profile.folds}-fold cross-validation, seed "
             f"{profile.seed}; debiasing: {profile.debias or 'off'}", "",
             "## Methods", "",
             "Held-out NLL of each method tried; a method is kept only if it beats the "
             "uncalibrated answers (and Platt or isotonic also beat temperature).", ""]
    method_rows = []
    for kind, kf in fit.kinds.items():
        params = ", ".join(f"{k}={v:.4g}" for k, v in kf.params.items()
                           if isinstance(v, float)) or (
            f"{len(kf.params['x'])} knots" if "x" in kf.params else "-")
        nll = [_f(kf.held_out_nll.get(m), 4) for m in ("none", "temperature", "platt", "isotonic")]
        method_rows.append([kind, str(kf.n), kf.method, params, *nll, kf.note or ""])
    lines += _rows(["type", "items", "method", "parameters", "NLL none", "NLL temperature",
                    "NLL platt", "NLL isotonic", "note"], method_rows)
    lines += ["", "## Held-out metrics", "", "ECE: 10 equal-width bins on the top probability.", ""]
    before, after = fit.metrics("before"), fit.metrics("after")
    metric_rows = [[scope, str(before[scope]["n"]),
                    *(f"{_f(before[scope][m])} -> {_f(after[scope][m])}"
                      for m in ("accuracy", "ece", "brier", "nll"))] for scope in before]
    lines += _rows(["scope", "n", "accuracy", "ECE", "Brier", "NLL"], metric_rows)
    lines += ["", "## Automation threshold", ""]
    if t.threshold is None:
        lines.append(f"No threshold backed by at least {t.min_count} held-out answers reaches the "
                     f"target accuracy {t.target_accuracy:g}: the profile records "
                     "`threshold: null` and routes every answer to review.")
    else:
        lines.append(f"Target accuracy {t.target_accuracy:g}: automate answers whose calibrated "
                     f"top probability is at least **{t.threshold:.4f}**; held out, that covers "
                     f"{t.coverage:.1%} of the answers ({t.count}) at accuracy {_f(t.accuracy)} "
                     f"(thresholds backed by fewer than {t.min_count} answers were not "
                     "considered).")
    lines += ["", f"![coverage vs accuracy]({paths['coverage'].name})", "",
              *_rows(["threshold", "coverage before", "accuracy before", "coverage after",
                      "accuracy after"],
                     [[f"{x:g}", *_at_threshold(fit.before, fit.golds, x),
                       *_at_threshold(fit.after, fit.golds, x)] for x in REPORT_THRESHOLDS]),
              "", "## Reliability", "", f"![reliability diagram]({paths['reliability'].name})", ""]
    bin_rows = [[f"{b.lower:.1f}-{b.upper:.1f}", str(b.count), _f(b.confidence), _f(b.accuracy),
                 str(a.count), _f(a.confidence), _f(a.accuracy)]
                for b, a in zip(reliability_bins(fit.before, fit.golds),
                                reliability_bins(fit.after, fit.golds))]
    lines += _rows(["bin", "n before", "confidence", "accuracy", "n after", "confidence",
                    "accuracy"], bin_rows)
    lines.append("")
    if plain is not None:
        lines += _position_section(plain, fit)
    return "\n".join(lines)


def write_report(out_dir: Path | str, profile: Profile, fit: CalibrationFit,
                 plain: CalibrationFit | None = None) -> dict[str, Path]:
    """Write the three files; ``plain`` (the fit on reads without debiasing) adds the
    position-bias comparison when ``fit`` is the debiased one."""
    paths = report_paths(out_dir, profile.name)
    paths["report"].parent.mkdir(parents=True, exist_ok=True)
    reliability_figure(fit, paths["reliability"])
    coverage_figure(fit, paths["coverage"], profile.threshold.target_accuracy,
                    profile.threshold.threshold)
    paths["report"].write_text(markdown(profile, fit, paths, plain), encoding="utf-8")
    return paths
