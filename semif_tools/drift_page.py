"""The drift report's page: one self-contained HTML file, its two figures embedded as PNG data.

Figures are drawn as calibrate's report draws them (report.py): matplotlib's Agg canvas
directly, no pyplot, no display, no global state.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from proxy.calibration.profile import Profile

from .calibrate.stats import Interval
from .drift import BINS, Drift, Window

__all__ = ["trend_figure", "distribution_figure", "page", "write_page"]


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _label(w: Window) -> str:
    return w.start.strftime("%m-%d %H:%M")


def _tick(w: Window) -> str:
    return f"{_label(w)}\nn={w.n}, {w.labelled} labelled"


def _series(
    ax: Axes, xs: Sequence[int], cis: Sequence[Interval | None], label: str, style: str
) -> None:
    points = [(x, ci) for x, ci in zip(xs, cis) if ci is not None]
    if not points:
        return
    ax.errorbar(
        [x for x, _ in points],
        [ci.value for _, ci in points],
        yerr=[
            [max(0.0, ci.value - ci.low) for _, ci in points],
            [max(0.0, ci.high - ci.value) for _, ci in points],
        ],
        fmt=style,
        capsize=3,
        label=label,
    )


def trend_figure(drift: Drift, target: float | None) -> str:
    """Accuracy, ECE, coverage (with intervals) and PSI per window; base64 PNG."""
    ws = drift.windows
    xs = list(range(len(ws)))
    fig = Figure(figsize=(9, 10))
    acc, ece, cov, shift = fig.subplots(4, 1, sharex=True)
    _series(acc, xs, [w.accuracy for w in ws], "accuracy of labelled decisions", "o-")
    if target is not None:
        acc.axhline(target, color="0.5", linestyle=":", label=f"target {target:g}")
    acc.set(ylabel="accuracy", ylim=(0, 1.05))
    _series(ece, xs, [w.ece for w in ws], "ECE (10 bins)", "s-")
    ece.set(ylabel="ECE", ylim=(0, None))
    _series(cov, xs, [w.coverage for w in ws], "coverage (share routed auto)", "o-")
    cov.set(ylabel="share", ylim=(0, 1.05))
    for name, values, style in (
        ("label mass", [w.psi_label_mass for w in ws], "o-"),
        ("confidence", [w.psi_confidence for w in ws], "s-"),
    ):
        pts = [(x, v) for x, v in zip(xs, values) if v is not None]
        shift.plot([x for x, _ in pts], [v for _, v in pts], style, label=f"PSI {name}")
    for line in (0.1, 0.25):
        shift.axhline(line, color="0.6", linestyle=":", linewidth=1)
    shift.set(ylabel="PSI", xlabel="window start (UTC)")
    shift.set_xticks(xs, [_tick(w) for w in ws], rotation=45, ha="right", fontsize=7)
    for ax in (acc, ece, cov, shift):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        else:
            ax.text(0.5, 0.5, "none in any window", ha="center", transform=ax.transAxes)
    acc.set_title(f"Per window ({drift.level:.0%} intervals; n in the table)")
    fig.tight_layout()
    return _png(fig)


def distribution_figure(drift: Drift) -> str:
    """Label-mass and confidence shares per bin: the reference against the newest window that
    has decisions; base64 PNG."""
    newest = next(w for w in reversed(drift.windows) if w.n)
    fig = Figure(figsize=(9, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    centres = [(i + 0.5) / BINS for i in range(BINS)]
    for ax, name, ref, now in (
        (axes[0], "label mass", drift.reference_label_mass, newest.label_mass),
        (axes[1], "confidence (top probability)", drift.reference_confidence, newest.confidence),
    ):
        for offset, label, counts in (
            (-0.022, f"reference (n={sum(ref)})", ref),
            (0.022, f"{_label(newest)} (n={sum(now)})", now),
        ):
            total = sum(counts) or 1
            ax.bar([c + offset for c in centres], [x / total for x in counts], 0.04, label=label)
        ax.set(xlim=(0, 1), xlabel=name)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("share of decisions")
    fig.tight_layout()
    return _png(fig)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ci(ci: Interval | None) -> str:
    return "-" if ci is None else f"{ci.value:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def _row(w: Window, previous: Window | None) -> list[str]:
    values = "; ".join(f"{k} {', '.join(v)}" for k, v in w.values.items() if v)
    changed = previous is not None and previous.n and w.n and previous.values != w.values
    return [
        w.start.strftime("%Y-%m-%d %H:%M") + (" *" if w.before_profile else ""),
        str(w.n),
        str(w.labelled),
        _ci(w.accuracy),
        _ci(w.ece),
        f"{_ci(w.coverage)} of {w.routed}",
        _f(w.review_share),
        f"{_f(w.automated_accuracy)} ({_f(w.automated_lower_bound)}) of {w.automated_labelled}",
        f"{_f(w.labelled_share_auto, 2)} / {_f(w.labelled_share_review, 2)}",
        _f(w.psi_label_mass),
        _f(w.psi_confidence),
        ("changed: " if changed else "") + values,
    ]


_HEADER = [
    "window (UTC)",
    "n",
    "labelled",
    "accuracy [Wilson]",
    "ECE [bootstrap]",
    "coverage [Wilson] of routed",
    "review share",
    "automated accuracy (lower bound) of n",
    "labelled share auto / review",
    "PSI label mass",
    "PSI confidence",
    "model, build, prompt format",
]

_STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em}"
    "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}"
    "td{text-align:right}td:last-child{text-align:left}img{max-width:100%}"
)


def page(drift: Drift, join_summary: str, profile: Profile | None, window: str) -> str:
    """The whole page (module docstring)."""
    e = html.escape
    target = profile.threshold.target_accuracy if profile is not None else None
    source = (
        f"profile <code>{e(profile.name)}</code> applied to the raw probabilities "
        f"(threshold {profile.threshold.threshold}, label-mass floor "
        f"{profile.label_mass_floor:.4f})"
        if profile is not None
        else "the probabilities and routes as served"
    )
    rows = [_row(w, drift.windows[i - 1] if i else None) for i, w in enumerate(drift.windows)]
    table = (
        "<table><tr>"
        + "".join(f"<th>{e(h)}</th>" for h in _HEADER)
        + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
        + "</table>"
    )
    notes = "".join(f"<li>{e(n)}</li>" for n in drift.notes)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Drift report</title><style>{_STYLE}</style></head>
<body>
<h1>Drift report</h1>
<ul>
<li>windows of {e(window)}; figures of {source}</li>
<li>join: {e(join_summary)}</li>
<li>PSI reference: {e(drift.reference)}; PSI below 0.1 is usually read as stable, above 0.25
as a large shift; it is noisy on small windows: up to about 9 (1/n + 1/n_reference) on
average even without a shift</li>
<li>accuracy and ECE are of the labelled decisions only; automated accuracy carries the
one-sided Clopper-Pearson lower bound at level {drift.level:g}. Outcomes are rarely a random
sample (reviewers label what went to review): read the automated accuracy only where the
labelled share of automated decisions is a sampled audit</li>
{notes}
</ul>
<img alt="figures per window" src="data:image/png;base64,{trend_figure(drift, target)}">
<h2>Distributions: the reference against the newest window</h2>
<img alt="distributions" src="data:image/png;base64,{distribution_figure(drift)}">
<h2>Table</h2>
{table}
</body></html>
"""


def write_page(
    path: Path | str, drift: Drift, join_summary: str, profile: Profile | None, window: str
) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page(drift, join_summary, profile, window), encoding="utf-8")
    return out
