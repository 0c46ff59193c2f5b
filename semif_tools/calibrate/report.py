"""The calibration report: ``NAME.report.md``, ``NAME.reliability.png``, ``NAME.coverage.png``.

"Before" is the answers as read; "after" is the same answers calibrated by the
maps the profile holds. Every figure is of the held-out test split, which no
choice saw (fit.py), with its sample size and bootstrap interval. Figures are
drawn with matplotlib's Agg canvas directly (no pyplot, no display, no global
state).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from proxy.calibration.profile import Profile
from proxy.calibration.transform import top_index

from .fit import CalibrationFit
from .scores import coverage_curve, position_shares, reliability_bins, top_probability
from .stats import Interval, clopper_pearson_lower

__all__ = [
    "REPORT_THRESHOLDS",
    "report_paths",
    "write_report",
    "reliability_figure",
    "coverage_figure",
    "markdown",
]

REPORT_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
_POSITIONS = "ABCDEFGHIJ"


def report_paths(out_dir: Path | str, name: str) -> dict[str, Path]:
    out = Path(out_dir)
    return {
        "report": out / f"{name}.report.md",
        "reliability": out / f"{name}.reliability.png",
        "coverage": out / f"{name}.coverage.png",
    }


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, metadata={"Software": None})


def _test(fit: CalibrationFit, which: str) -> tuple[list[list[float]], list[int]]:
    probs = fit.before if which == "before" else fit.after
    idx = fit.indices("test")
    return [probs[i] for i in idx], [fit.golds[i] for i in idx]


def reliability_figure(fit: CalibrationFit, path: Path) -> None:
    """Accuracy against mean top probability per bin, before and after, with bin counts."""
    fig = Figure(figsize=(7, 7))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect calibration")
    golds = _test(fit, "before")[1]
    for label, probs, style, offset in (
        ("before", _test(fit, "before")[0], "o-", -0.012),
        ("after", _test(fit, "after")[0], "s-", 0.012),
    ):
        bins = [b for b in reliability_bins(probs, golds) if b.count]
        (line,) = top.plot(
            [b.confidence for b in bins], [b.accuracy for b in bins], style, label=label
        )
        for b in bins:
            top.annotate(
                str(b.count),
                (b.confidence, b.accuracy),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=7,
                color=line.get_color(),
            )
        all_bins = reliability_bins(probs, golds)
        bottom.bar(
            [(b.lower + b.upper) / 2 + offset for b in all_bins],
            [b.count for b in all_bins],
            width=0.022,
            color=line.get_color(),
            label=label,
        )
    top.set(
        xlim=(0, 1),
        ylim=(0, 1.05),
        ylabel="accuracy in bin",
        title=f"Reliability on the held-out test split (n={len(golds)}; 10 bins, "
        "numbers are bin counts)",
    )
    top.legend(loc="upper left", fontsize=8)
    bottom.set(xlabel="top probability", ylabel="answers")
    fig.tight_layout()
    _save(fig, path)


def coverage_figure(
    fit: CalibrationFit, path: Path, target: float, threshold: float | None
) -> None:
    """Accuracy of the automated answers against the share automated, before and after, on
    the test split, with the profile's threshold marked where it lands there."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    golds = _test(fit, "before")[1]
    for label, which in (("before", "before"), ("after", "after")):
        curve = coverage_curve(_test(fit, which)[0], golds)[::-1]  # coverage ascending
        ax.plot([p.coverage for p in curve], [p.accuracy for p in curve], label=label)
    ax.axhline(target, color="0.5", linestyle=":", label=f"target accuracy {target:g}")
    on_test = fit.threshold_on_test()
    if threshold is not None and on_test["count"]:
        ax.plot(
            [on_test["coverage"]],
            [on_test["accuracy"]],
            "k*",
            markersize=10,
            label=f"threshold {threshold:.2f}: coverage {on_test['coverage']:.0%}",
        )
    ax.set(
        xlim=(0, 1.02),
        ylim=(0, 1.02),
        xlabel="coverage (share of answers automated)",
        ylabel="accuracy of automated answers",
        title=f"Coverage vs accuracy on the held-out test split (n={len(golds)})",
    )
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _rows(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _ci(ci: Interval, digits: int = 3) -> str:
    return f"{ci.value:.{digits}f} [{ci.low:.{digits}f}, {ci.high:.{digits}f}]"


def _at_threshold(
    probs: Sequence[Sequence[float]], golds: Sequence[int], t: float, level: float
) -> list[str]:
    picked = [(p, g) for p, g in zip(probs, golds) if top_probability(p) >= t]
    right = sum(top_index(p) == g for p, g in picked)
    if not picked:
        return ["0.0% (0)", "-", "-"]
    return [
        f"{len(picked) / len(golds):.1%} ({len(picked)})",
        _f(right / len(picked)),
        _f(clopper_pearson_lower(right, len(picked), level)),
    ]


def _position_section(plain: CalibrationFit, debiased: CalibrationFit, method: str) -> list[str]:
    idx = plain.indices("test")
    width = min(len(_POSITIONS), max(len(plain.before[i]) for i in idx))
    rows = []
    for kind in plain.kinds:
        members = [i for i in idx if plain.item_kinds[i] == kind]
        if kind == "score" or not members:
            continue
        n = min(width, max(len(plain.before[i]) for i in members))
        for label, positions in (
            ("gold answers", [plain.golds[i] for i in members]),
            ("without debiasing", [top_index(plain.before[i]) for i in members]),
            (f"{method} debiasing", [top_index(debiased.before[i]) for i in members]),
        ):
            shares = position_shares(positions, width)
            rows.append(
                [
                    kind,
                    str(len(members)),
                    label,
                    *(f"{x:.0%}" if j < n else "" for j, x in enumerate(shares)),
                ]
            )
    lines = [
        "## Position bias",
        "",
        "Held-out test split: share of answers whose choice was shown at each position "
        "(noul: A is yes, B no).",
        "",
        *_rows(["type", "n", "", *_POSITIONS[:width]], rows),
        "",
        "Same items, same split and folds (uncalibrated and calibrated):",
        "",
    ]
    metric_rows = []
    for label, fit in (("without debiasing", plain), (f"{method} debiasing", debiased)):
        before, after = fit.intervals("before"), fit.intervals("after")
        for scope in before:
            b, a = before[scope], after[scope]
            metric_rows.append(
                [
                    scope,
                    str(b["accuracy"].n),
                    label,
                    _ci(b["accuracy"]),
                    _ci(a["accuracy"]),
                    _ci(b["ece"]),
                    _ci(a["ece"]),
                ]
            )
    return [
        *lines,
        *_rows(
            [
                "scope",
                "n",
                "reads",
                "accuracy raw",
                "accuracy calibrated",
                "ECE raw",
                "ECE calibrated",
            ],
            metric_rows,
        ),
        "",
    ]


def _threshold_section(profile: Profile, fit: CalibrationFit) -> list[str]:
    t = profile.threshold
    test = t.test
    lines = [
        "## Automation threshold",
        "",
        f"Candidates 0.99, 0.98, ... tested from the highest down (fixed-sequence "
        f"testing): a candidate passes when the one-sided Clopper-Pearson lower bound at "
        f"level {t.level:g} on the accuracy of the answers at or above it reaches the "
        f"target {t.target_accuracy:g}; the first that fails ends the sequence. Tested on "
        f"the {t.source}; candidates backed by fewer than {t.min_count} answers (or too "
        "few to pass at all) are not tested.",
        "",
    ]
    if t.threshold is None:
        lines.append(
            "**No threshold passed**: the profile records `threshold: null` and routes "
            "every answer to review."
        )
    else:
        lines.append(
            f"Threshold **{t.threshold:.2f}**: on the threshold split it covers {t.coverage:.1%} "
            f"({t.count} answers) at accuracy {_f(t.accuracy)}, lower bound "
            f"{_f(t.lower_bound)}. On the held-out test split it automates {test['count']} of "
            f"{test['n']} answers ({test['coverage']:.1%})"
            + (
                f" at accuracy {_f(test['accuracy'])}, lower bound {_f(test['lower_bound'])}."
                if test["count"]
                else "."
            )
        )
    diverted = test["below_floor"]
    lines += [
        "",
        "## Label-mass floor",
        "",
        f"Answers whose labels got less than **{profile.label_mass_floor:.4f}** of the "
        "model's probability go to review whatever their probability "
        "(`route_reason: label_mass`): the 5% quantile of the label masses outside the "
        "test split, capped at 0.5, unless set. On the held-out test split it diverts "
        f"{diverted} of {test['n']} answers"
        + (f" (their accuracy {_f(test['below_floor_accuracy'])})." if diverted else "."),
        "",
    ]
    return lines


def markdown(
    profile: Profile,
    fit: CalibrationFit,
    paths: dict[str, Path],
    plain: CalibrationFit | None = None,
) -> str:
    lines = [
        f"# Calibration report: {profile.name}",
        "",
        f"- model: `{profile.model}`",
        f"- llama.cpp build: `{profile.llama_build or '?'}`",
        f"- prompt format: `{profile.prompt_format_version}`",
        f"- data sha256: `{profile.data_sha256}` ({profile.n_items} items)",
        f"- created: {profile.created}; {profile.folds}-fold cross-validation, seed "
        f"{profile.seed}; debiasing: {profile.debias or 'off'}",
        f"- evaluation: {fit.evaluation()}",
        "",
        "## Methods",
        "",
        "Cross-validated NLL of each method tried on the fit split; a method is kept only "
        "if it beats the uncalibrated answers without a worse ECE (and Platt or isotonic "
        "also beat temperature). The kept map is fitted on the whole fit split and is "
        "what the profile serves.",
        "",
    ]
    method_rows = []
    for kind, kf in fit.kinds.items():
        params = ", ".join(
            f"{k}={v:.4g}" for k, v in kf.params.items() if isinstance(v, float)
        ) or (f"{len(kf.params['x'])} knots" if "x" in kf.params else "-")
        nll = [_f(kf.held_out_nll.get(m), 4) for m in ("none", "temperature", "platt", "isotonic")]
        method_rows.append([kind, str(kf.n), kf.method, params, *nll, kf.note or ""])
    lines += _rows(
        [
            "type",
            "fit items",
            "method",
            "parameters",
            "NLL none",
            "NLL temperature",
            "NLL platt",
            "NLL isotonic",
            "note",
        ],
        method_rows,
    )
    lines += [
        "",
        "## Held-out test split",
        "",
        f"Value [{fit.level:.0%} percentile-bootstrap interval over the scope's items]. "
        "ECE: 10 equal-width bins on the top probability.",
        "",
    ]
    before, after = fit.intervals("before"), fit.intervals("after")
    metric_rows = [
        [
            scope,
            str(before[scope]["accuracy"].n),
            *(
                f"{_ci(before[scope][m])} -> {_ci(after[scope][m])}"
                for m in ("accuracy", "ece", "brier", "nll")
            ),
        ]
        for scope in before
    ]
    lines += _rows(["scope", "n", "accuracy", "ECE", "Brier", "NLL"], metric_rows)
    lines += ["", *_threshold_section(profile, fit)]
    test_before, golds = _test(fit, "before")
    test_after = _test(fit, "after")[0]
    level = fit.level
    lines += [
        f"![coverage vs accuracy]({paths['coverage'].name})",
        "",
        "Held-out test split at fixed thresholds (for reading only: none of these was "
        f"chosen on it); bound: one-sided Clopper-Pearson at level {level:g}.",
        "",
        *_rows(
            [
                "threshold",
                "coverage before",
                "accuracy before",
                "bound before",
                "coverage after",
                "accuracy after",
                "bound after",
            ],
            [
                [
                    f"{x:g}",
                    *_at_threshold(test_before, golds, x, level),
                    *_at_threshold(test_after, golds, x, level),
                ]
                for x in REPORT_THRESHOLDS
            ],
        ),
        "",
        "## Reliability",
        "",
        f"![reliability diagram]({paths['reliability'].name})",
        "",
    ]
    bin_rows = [
        [
            f"{b.lower:.1f}-{b.upper:.1f}",
            str(b.count),
            _f(b.confidence),
            _f(b.accuracy),
            str(a.count),
            _f(a.confidence),
            _f(a.accuracy),
        ]
        for b, a in zip(reliability_bins(test_before, golds), reliability_bins(test_after, golds))
    ]
    lines += _rows(
        ["bin", "n before", "confidence", "accuracy", "n after", "confidence", "accuracy"], bin_rows
    )
    lines.append("")
    if plain is not None:
        lines += _position_section(plain, fit, profile.debias or "debiased")
    return "\n".join(lines)


def write_report(
    out_dir: Path | str, profile: Profile, fit: CalibrationFit, plain: CalibrationFit | None = None
) -> dict[str, Path]:
    """Write the three files; ``plain`` (the fit on reads without debiasing) adds the
    position-bias comparison when ``fit`` is the debiased one."""
    paths = report_paths(out_dir, profile.name)
    paths["report"].parent.mkdir(parents=True, exist_ok=True)
    reliability_figure(fit, paths["reliability"])
    coverage_figure(
        fit, paths["coverage"], profile.threshold.target_accuracy, profile.threshold.threshold
    )
    paths["report"].write_text(markdown(profile, fit, paths, plain), encoding="utf-8")
    return paths
