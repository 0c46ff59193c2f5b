"""Calibration fitted per workload: metrics, fitting, profiles, report and the CLI.

Pure logic, no aiohttp. The proxy needs only ``profile`` (load, check, apply,
route) and ``transform``; ``read`` (httpx) and ``report`` (matplotlib) are
used by the ``calibrate`` command alone, so nothing here imports them.

    metrics.py    accuracy, ECE, Brier, NLL, reliability bins, coverage curve
    stats.py      Clopper-Pearson bounds, bootstrap intervals, fixed-sequence thresholds
    transform.py  the calibration maps (temperature, Platt, isotonic)
    fit.py        the held-out split, the maps by cross-validation, floor and threshold
    profile.py    the profile file, apply(), route(), check_compatible()
    dataset.py    the labelled JSONL format
    read.py       reading items through a running proxy (httpx)
    report.py     the Markdown report and its two PNGs (matplotlib, Agg)
    cli.py        python -m proxy.calibration / python -m proxy calibrate
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``calibrate`` command; imported only when run (it needs httpx and matplotlib)."""
    from .cli import main as run

    return run(argv)
