"""``calibrate --records R --outcomes O --profile NAME``: fit from decision records, reading
nothing again.

The items are the outcomes that pair with a record, **in the outcomes' order** (a record is
an answer already read; an outcome makes it a labelled item). The split, the folds and every
choice after them (fit.py) are drawn by position in the item list, so the same labelled items
in the same order with the same seed get the same roles, maps, floor and threshold as the
re-reading fit (``calibrate DATA.jsonl``): an outcomes file written from a labelled JSONL
line by line is that labelled set, whatever order the records were written in (completion
order under concurrency, several files or replicas' shards in any order).

Each item's probabilities are the record's ``raw_probabilities`` (after debiasing, before
calibration): what the re-reading fit reads with ``"x_calibration": "none"``. A yes/no answer
becomes (P(true), 1 - P(true)), as read.py makes it from the served P(true).

Refused, with a message saying why: records that differ in model, llama.cpp build, prompt
format, layout, read scheme or debiasing (``records.AGREED``), unless ``--group-by`` fits one
profile per group; ``--debias pride`` (its prior is estimated from cyclic reads of a sample
of the items, every rotation's probabilities, which records do not carry); records served
with PriDe (their raw probabilities were divided by the serving profile's prior); and
``--debias`` naming another mode than the records'. A debiased fit from records has no
comparison with plain reads (those were never made).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from proxy.calibration.profile import profile_path, save
from proxy.decision.question import NOUL_NAMES

from ..files import data_files
from ..outcomes import Joined, join, load_outcomes
from ..record_files import AGREED, Record, RecordError, disagreement, group_key, load_records
from .dataset import data_sha256
from .fit import KINDS, Labelled
from .profile_fit import Fitted, check_settings, fit_profile, parse_methods, summarise

__all__ = [
    "FromRecords",
    "labelled",
    "recorded_debias",
    "records_groups",
    "fit_records",
    "records_main",
]


class FromRecords(ValueError):
    """The records cannot give this fit; the message says why and what to do."""


def labelled(record: Record, gold: int) -> Labelled:
    """The item a record and its outcome make (module docstring)."""
    kind = record.question_type
    if kind not in KINDS:
        raise RecordError(
            f"{record.source}: question type {kind!r} is not one calibrate fits {list(KINDS)}"
        )
    if kind == "noul" and record.options != NOUL_NAMES:
        raise RecordError(
            f"{record.source}: a yes/no record must have options {list(NOUL_NAMES)}, "
            f"got {list(record.options)}"
        )
    return Labelled(kind, record.read(), gold, record.label_mass)


def recorded_debias(records: Sequence[Record], requested: str | None) -> str | None:
    """The debiasing the profile records: the records' own (they agree), checked against
    ``--debias`` (module docstring)."""
    if requested == "pride":
        raise FromRecords(
            "--debias pride cannot be fitted from records alone: PriDe estimates the position "
            "prior from cyclic reads (every rotation's probabilities) of a sample of the items, "
            "which records do not carry; fit it with the re-reading calibrate (DATA.jsonl "
            "against a running proxy)"
        )
    modes = {r.value("debias") for r in records}
    recorded = modes.pop() if len(modes) == 1 else None
    if recorded == "pride":
        raise FromRecords(
            "these records were served with PriDe: their raw probabilities were divided by the "
            "serving profile's position prior, which a new profile would not carry; refit with "
            "the re-reading calibrate --debias pride"
        )
    if requested is not None and requested != recorded:
        raise FromRecords(
            f"--debias {requested} asks for {requested} reads, but the records were served "
            f"with debias {recorded!r}; a fit from records fits the reads the records hold "
            "(leave --debias out)"
        )
    return recorded


def records_groups(joined: Joined, group_by: bool) -> list[list[tuple[Record, int]]]:
    """The paired items, one list when they agree (else ``FromRecords`` naming what differs),
    or with ``group_by`` one list per group of equal ``AGREED`` values, largest first (ties
    by the values), each in the outcomes' order."""
    if not joined.pairs:
        raise FromRecords(f"no record has an outcome: {joined.summary()}")
    differs = disagreement([r for r, _ in joined.pairs])
    if differs is None:
        return [joined.pairs]
    if not group_by:
        raise FromRecords(
            f"{differs}. Fit each kind apart (--group-by writes one profile per group), or "
            "pass only the records of one"
        )
    groups: dict[tuple[str | None, ...], list[tuple[Record, int]]] = {}
    for pair in joined.pairs:
        groups.setdefault(group_key(pair[0]), []).append(pair)
    return sorted(groups.values(), key=lambda g: (-len(g), [str(v) for v in group_key(g[0][0])]))


def _describe(record: Record) -> str:
    return ", ".join(f"{name} {record.agreed[i]!r}" for i, name in enumerate(AGREED))


def fit_records(
    pairs: Sequence[tuple[Record, int]],
    *,
    name: str,
    data_sha256: str,
    debias: str | None = None,
    created: str | None = None,
    **settings: Any,
) -> Fitted:
    """The profile of these paired records (one group, in the outcomes' order):
    ``fit_profile`` on the items they make, with the model, build, prompt format and read
    scheme the records agree on; ``settings`` are fit_profile's (seed, folds, shares, ...)."""
    records = [r for r, _ in pairs]
    differs = disagreement(records)
    if differs is not None:
        raise FromRecords(differs)
    first = records[0]
    return fit_profile(
        [labelled(r, gold) for r, gold in pairs],
        name=name,
        model=first.value("model") or "",
        prompt_format_version=first.value("prompt_format_version") or "",
        data_sha256=data_sha256,
        debias=recorded_debias(records, debias),
        llama_build=first.value("llama_build") or "",
        read_scheme=first.value("read_scheme") or "",
        created=created,
        **settings,
    )


def records_main(args: argparse.Namespace) -> int:
    """Load, join, check, fit each group and write its profile and report (cli.py's flags)."""
    from .report import write_report  # matplotlib only when a report is written

    try:
        profile_path(args.profile, args.out_dir)
        methods = parse_methods(args.methods)
        check_settings(args)
        if not args.outcomes:
            raise FromRecords("--records needs --outcomes (the labels, by decision id)")
        if args.debias == "pride":
            recorded_debias([], args.debias)  # refused before anything is read
        joined = join(load_records(args.records), load_outcomes(args.outcomes))
        print(f"records: {joined.summary()}", file=sys.stderr)
        groups = records_groups(joined, args.group_by)
        sha = data_sha256(data_files([*args.records, *args.outcomes]))
        jobs = []
        for number, pairs in enumerate(groups, 1):
            pairs = pairs[: args.limit] if args.limit is not None else pairs
            name = args.profile if len(groups) == 1 else f"{args.profile}.{number}"
            profile_path(name, args.out_dir)
            fitted = fit_records(
                pairs,
                name=name,
                data_sha256=sha,
                debias=args.debias,
                target_accuracy=args.target_accuracy,
                min_automated=args.min_automated,
                level=args.level,
                test_share=args.test_share,
                threshold_share=args.threshold_share,
                label_mass_floor=args.label_mass_floor,
                folds=args.folds,
                seed=args.seed,
                methods=methods,
            )
            jobs.append((fitted, pairs[0][0]))
    except (ValueError, OSError) as exc:  # RecordError, FromRecords, ProfileError: ValueErrors
        kind = "data" if isinstance(exc, RecordError) else "error"
        print(f"calibrate: {kind}: {exc}", file=sys.stderr)
        return 2
    for fitted, first in jobs:
        if len(jobs) > 1:
            print(f"{fitted.profile.name}: {fitted.profile.n_items} items of {_describe(first)}")
        path = save(fitted.profile, args.out_dir)
        paths = write_report(args.out_dir, fitted.profile, fitted.fit)
        summarise(fitted, path, paths)
    return 0
