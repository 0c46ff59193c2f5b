"""``python -m semif_tools drift --records R --outcomes O [--profile P] --out report.html``:
the drift command. Its table is drift.py's (what each figure means: its docstring), its page
drift_page.py's; this module reads the files, builds the one and writes the other.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from proxy.calibration.profile import DEFAULT_DIR, Profile, load

from .calibrate.stats import BOOTSTRAP_RESAMPLES, DEFAULT_LEVEL
from .drift import decisions, drift_table, parse_window
from .outcomes import join, load_outcomes
from .record_files import RecordError, load_records

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m semif_tools drift",
        description="Accuracy, ECE, coverage and distribution shift of recorded decisions "
        "against their outcomes, by time window, as one self-contained HTML page.",
    )
    p.add_argument(
        "--records",
        nargs="+",
        type=Path,
        required=True,
        help="decision records: files, or folders read recursively in date order (aws s3 "
        "sync's copy of a dated prefix; s3:// URIs are not read)",
    )
    p.add_argument(
        "--outcomes",
        nargs="*",
        type=Path,
        default=[],
        help="outcomes (Model Monitor ground-truth JSON lines, keyed by decision id or the "
        "capture's inferenceId or eventId; files or folders as --records); without them, "
        "only coverage and the distributions",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="a profile name (in --profile-dir) or a .json path: apply it to the raw "
        "probabilities instead of using what was served",
    )
    p.add_argument("--profile-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--window", default="1d", help="window width: 30m, 12h, 1d, 1w (default 1d)")
    p.add_argument("--level", type=float, default=DEFAULT_LEVEL, help="of every interval")
    p.add_argument(
        "--resamples",
        type=int,
        default=BOOTSTRAP_RESAMPLES,
        help=f"bootstrap resamples of the ECE intervals (default {BOOTSTRAP_RESAMPLES})",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    p.add_argument("--out", type=Path, required=True, help="the HTML page to write")
    p.add_argument("--json", type=Path, default=None, help="also write the table as JSON")
    return p


def _profile(text: str, directory: Path) -> Profile:
    if text.endswith(".json"):
        return Profile.from_json(json.loads(Path(text).read_text(encoding="utf-8")))
    return load(text, directory)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .drift_page import write_page  # matplotlib only when a page is written

    try:
        width = parse_window(args.window)
        if not 0 < args.level < 1 or args.resamples < 1:
            raise ValueError("--level must be within (0, 1) and --resamples at least 1")
        profile = _profile(args.profile, args.profile_dir) if args.profile else None
        loaded = load_records(args.records)
        records = loaded.records
        joined = join(loaded, load_outcomes(args.outcomes))
        golds = {r.decision_id: gold for r, gold in joined.pairs}
        table = drift_table(
            decisions(records, golds, profile),
            width,
            profile=profile,
            level=args.level,
            seed=args.seed,
            resamples=args.resamples,
        )
    except (ValueError, OSError) as exc:  # RecordError and ProfileError are ValueErrors
        kind = "data" if isinstance(exc, RecordError) else "error"
        print(f"drift: {kind}: {exc}", file=sys.stderr)
        return 2
    print(f"records: {joined.summary()}", file=sys.stderr)
    write_page(args.out, table, joined.summary(), profile, args.window)
    if args.json is not None:
        args.json.write_text(json.dumps(table.to_json(), indent=1) + "\n", encoding="utf-8")
    print(f"{len(table.windows)} windows of {args.window}; wrote {args.out}")
    return 0
