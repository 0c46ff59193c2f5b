"""Outcomes, the labels decisions get later, read, written and joined to their records.

The shape (SageMaker Model Monitor's ground truth), its two encodings and the keys an outcome
may name its decision by are described in ``record_files.py``'s docstring; ``write_outcomes``
writes CSV, the encoding AWS documents. ``join`` pairs each outcome with its record, in the
outcomes' order (the labelled set's order: see ``semif_tools/calibrate/from_records.py``), and
counts what does not pair.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .record_files import FITTED_APIS, Loaded, Record, RecordError, json_lines

__all__ = [
    "Outcome",
    "Joined",
    "parse_outcome",
    "load_outcomes",
    "gold_index",
    "join",
    "csv_field",
    "outcome_line",
    "write_outcomes",
]


@dataclass(frozen=True)
class Outcome:
    source: str
    key: str  # eventMetadata.eventId: one of its record's join_keys
    label: Any  # CSV: the field's text; JSON: the decoded value


def _label(ground: Any) -> Any:
    if not isinstance(ground, dict) or not isinstance(ground.get("data"), str):
        raise ValueError('groundTruthData must be an object with a string "data"')
    data, encoding = ground["data"], ground.get("encoding")
    if encoding == "CSV":
        rows = list(csv.reader(io.StringIO(data, newline="")))
        if len(rows) != 1 or len(rows[0]) != 1:
            raise ValueError(f"CSV data must be one field naming the option, got {data!r}")
        return rows[0][0]
    if encoding == "JSON":
        try:
            return json.loads(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"JSON data is not JSON: {data!r}") from exc
    raise ValueError(f'groundTruthData.encoding must be "CSV" or "JSON", got {encoding!r}')


def parse_outcome(data: Any, source: str = "<outcome>") -> Outcome:
    try:
        if not isinstance(data, dict):
            raise ValueError("each line must be a JSON object")
        meta = data.get("eventMetadata")
        event = meta.get("eventId") if isinstance(meta, dict) else None
        if not isinstance(event, str) or not event:
            raise ValueError(
                "eventMetadata.eventId must name the decision (a non-empty string: its "
                "decision id, or the capture's inferenceId or eventId)"
            )
        version = data.get("eventVersion", "0")
        if not isinstance(version, str):
            raise ValueError(f"eventVersion must be a string, got {version!r}")
        return Outcome(source, event, _label(data.get("groundTruthData")))
    except ValueError as exc:
        raise RecordError(f"{source}: {exc}") from exc


def _unique(outcomes: Iterable[Outcome]) -> list[Outcome]:
    seen: dict[str, str] = {}
    out = []
    for outcome in outcomes:
        first = seen.setdefault(outcome.key, outcome.source)
        if first != outcome.source:
            raise RecordError(
                f"{outcome.source}: {outcome.key!r} again (its outcome is first at {first})"
            )
        out.append(outcome)
    return out


def load_outcomes(paths: Iterable[Path | str]) -> list[Outcome]:
    """Every outcome of the files and folders, in read order; two outcomes with one key are
    refused (a labelling error to settle, not to guess at)."""
    return _unique(parse_outcome(d, s) for s, d in json_lines(paths))


def gold_index(record: Record, label: Any) -> int | None:
    """The option an outcome names, as an index into the record's options (None when it names
    none): the option name itself; JSON ``true``/``false`` name "true"/"false" (yes/no
    questions); a JSON integer names the option of that text (a score level "0", "1", ...)."""
    if isinstance(label, bool):
        label = "true" if label else "false"
    elif isinstance(label, int):
        label = str(label)
    if isinstance(label, str) and label in record.options:
        return record.options.index(label)
    return None


@dataclass(frozen=True)
class Joined:
    """Records with an outcome, in the outcomes' order, and what did not pair."""

    pairs: list[tuple[Record, int]]  # (record, gold option index)
    n_records: int
    n_outcomes: int
    without_outcome: int  # records (of FITTED_APIS) no outcome names
    unmatched: list[Outcome]  # outcomes whose key no record has
    unknown_option: list[tuple[Outcome, Record]]  # outcomes naming an option the record lacks
    left_out: Counter[str]  # records of other APIs, by API
    left_out_outcomes: int = 0  # outcomes of those records
    ambiguous: list[Outcome] = field(default_factory=list)  # keys of two records: left out
    again: list[Outcome] = field(default_factory=list)  # a record's second outcome: left out
    loaded: str = ""  # what loading the records left out (Loaded.summary)

    def summary(self) -> str:
        """The join, in words (printed by calibrate and drift, shown on the drift page)."""
        parts = [
            f"{len(self.pairs)} of {self.n_records} records joined to an outcome",
            f"{self.without_outcome} records have none",
            f"{len(self.unmatched)} of {self.n_outcomes} outcomes name no record",
            f"{len(self.unknown_option)} outcomes name an option their record does not have",
        ]
        if self.unmatched:
            parts[2] += f" (first: {self.unmatched[0].source})"
        if self.unknown_option:
            outcome, record = self.unknown_option[0]
            parts[3] += (
                f" (first: {outcome.source} names {outcome.label!r}, options "
                f"{list(record.options)})"
            )
        if self.ambiguous:
            first = self.ambiguous[0]
            parts.append(
                f"{len(self.ambiguous)} outcomes name a key that several records have, left "
                f"out (first: {first.source}, {first.key!r})"
            )
        if self.again:
            parts.append(
                f"{len(self.again)} outcomes name a record another outcome named first, left "
                f"out (first: {self.again[0].source})"
            )
        if self.left_out:
            parts.append(
                "left out: "
                + ", ".join(f"{n} {api} records" for api, n in sorted(self.left_out.items()))
                + f" ({self.left_out_outcomes} outcomes)"
            )
        if self.loaded:
            parts.append(self.loaded)
        return "; ".join(parts)


def _index(records: Sequence[Record]) -> dict[str, Record | None]:
    """Each key of the records (``join_keys``) to its record; None where two records share it."""
    index: dict[str, Record | None] = {}
    for record in records:
        for key in record.keys:
            index[key] = record if index.get(key, record) is record else None
    return index


def join(records: Sequence[Record] | Loaded, outcomes: Sequence[Outcome]) -> Joined:
    """Pair outcomes with records by key (module docstring): an outcome names the record one
    of whose ``join_keys`` is its key; a key two records have pairs with neither, and a
    record's second outcome is left out (both counted). Records of APIs outside
    ``FITTED_APIS`` are left out (and counted), as are the outcomes naming them. ``records``
    may be what ``load_records`` gave: its summary joins this one's."""
    loaded = records.summary() if isinstance(records, Loaded) else ""
    records = records.records if isinstance(records, Loaded) else records
    left_out = Counter(r.api for r in records if r.api not in FITTED_APIS)
    index = _index(records)
    pairs, unmatched, unknown, ambiguous, again = [], [], [], [], []
    labelled: set[str] = set()
    skipped = 0
    for outcome in outcomes:
        if outcome.key not in index:
            unmatched.append(outcome)
            continue
        record = index[outcome.key]
        if record is None:
            ambiguous.append(outcome)
            continue
        if record.api not in FITTED_APIS:
            skipped += 1
            continue
        if record.decision_id in labelled:
            again.append(outcome)
            continue
        gold = gold_index(record, outcome.label)
        if gold is None:
            unknown.append((outcome, record))
            continue
        pairs.append((record, gold))
        labelled.add(record.decision_id)
    fitted = [r for r in records if r.api in FITTED_APIS]
    without = sum(r.decision_id not in labelled for r in fitted)
    return Joined(
        pairs,
        len(records),
        len(outcomes),
        without,
        unmatched,
        unknown,
        left_out,
        skipped,
        ambiguous,
        again,
        loaded,
    )


def csv_field(text: str) -> str:
    """``text`` as one CSV field, quoted as the csv module quotes (RFC 4180: a field holding
    a comma, a quote or a line break in double quotes, each quote doubled)."""
    out = io.StringIO()
    csv.writer(out).writerow([text])  # the \r\n it ends with makes line breaks quoted
    return out.getvalue().removesuffix("\r\n")


def outcome_line(key: str, option: str) -> dict[str, Any]:
    """An outcome naming ``option`` for the decision ``key`` names, in Model Monitor's shape
    with AWS's documented encoding, CSV (``csv_field``: any option name reads back whole)."""
    return {
        "groundTruthData": {"data": csv_field(option), "encoding": "CSV"},
        "eventMetadata": {"eventId": key},
        "eventVersion": "0",
    }


def write_outcomes(path: Path | str, labels: Iterable[tuple[str, str]]) -> int:
    """Write (key, option name) pairs as outcomes, in the order given; their count."""
    lines = [json.dumps(outcome_line(d, o), ensure_ascii=False) + "\n" for d, o in labels]
    Path(path).write_text("".join(lines), encoding="utf-8")
    return len(lines)
