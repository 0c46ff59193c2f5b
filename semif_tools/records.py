"""Decision records and their outcomes, read back offline.

A record file is JSON lines, one ``semif.decision/1`` object per decision, as the proxy writes
them (``--decision-records``). An outcomes file is JSON lines in SageMaker Model Monitor's
ground-truth shape::

    {"groundTruthData": {"data": "billing", "encoding": "CSV"},
     "eventMetadata": {"eventId": "<decision id>"}, "eventVersion": "0"}

``encoding`` "CSV": ``data`` is one CSV field naming the option; "JSON": ``data`` is a JSON
text (a string naming the option, ``true``/``false`` for a yes/no question, a level index for
a score). Blank lines are skipped in both; any other line that is not such an object is a
``RecordError`` naming the file and the line.

``join`` pairs each outcome with its record by decision id, in the outcomes' order (the
labelled set's order: see ``semif_tools/calibrate/from_records.py``), and counts what does
not pair. ``disagreement`` says which of ``AGREED`` differ between records.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RECORD_FORMAT",
    "AGREED",
    "FITTED_APIS",
    "RecordError",
    "Record",
    "Outcome",
    "Joined",
    "parse_record",
    "parse_outcome",
    "load_records",
    "load_outcomes",
    "gold_index",
    "join",
    "disagreement",
    "group_key",
    "outcome_line",
    "write_outcomes",
]

RECORD_FORMAT = "semif.decision/1"
# what produced a record's raw probabilities: records that differ in one of these are not one
# population (a fit refuses or groups them; debias too, since raw means "after debiasing")
AGREED = ("model", "llama_build", "prompt_format_version", "layout", "read_scheme", "debias")
# the APIs whose decisions are one labelled question each (rerank documents are judged per
# query, with NDCG: rerank_fit.py; their records are left out and counted)
FITTED_APIS = ("chat", "system_one", "decisions", "invocations")


class RecordError(ValueError):
    """A line of a record or outcome file is unusable; the message names file and line."""


@dataclass(frozen=True)
class Record:
    source: str  # "file:line"
    decision_id: str
    time: dt.datetime  # UTC, aware
    api: str
    question_type: str
    options: tuple[str, ...]
    raw_probabilities: tuple[float, ...]  # after debiasing, before calibration
    probabilities: tuple[float, ...]  # as served
    confidence: float
    label_mass: float | None
    route: str | None
    threshold: float | None
    agreed: tuple[str | None, ...]  # the values of AGREED, in that order
    fields: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    def read(self) -> tuple[float, ...]:
        """The raw probabilities as calibrate reads them: a yes/no answer as (P(true),
        1 - P(true)), as read.py makes it from the served P(true); others as recorded."""
        probs = self.raw_probabilities
        return (probs[0], 1.0 - probs[0]) if self.question_type == "noul" else probs

    def value(self, name: str) -> str | None:
        """One of ``AGREED``'s values."""
        return self.agreed[AGREED.index(name)]


@dataclass(frozen=True)
class Outcome:
    source: str
    decision_id: str
    label: Any  # CSV: the field's text; JSON: the decoded value


def _lines(paths: Iterable[Path | str]) -> Iterator[tuple[str, Any]]:
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                source = f"{path}:{number}"
                try:
                    yield source, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RecordError(f"{source}: not JSON: {exc}") from exc


def _numbers(value: Any, what: str, n: int) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"{what} must be a list of {n} numbers (one per option)")
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"{what} must hold finite numbers, got {x!r}")
        out.append(float(x))
    return tuple(out)


def _optional_number(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number or null, got {value!r}")
    return float(value)


def _time(value: Any) -> dt.datetime:
    if not isinstance(value, str):
        raise ValueError(f"time must be an ISO 8601 string, got {value!r}")
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"time {value!r} is not ISO 8601") from exc
    if when.tzinfo is None:
        raise ValueError(f"time {value!r} has no time zone (records are UTC, ending in Z)")
    return when.astimezone(dt.UTC)


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string, got {value!r}")
    return value


def parse_record(data: Any, source: str = "<record>") -> Record:
    try:
        if not isinstance(data, dict):
            raise ValueError("each line must be a JSON object")
        if data.get("record") != RECORD_FORMAT:
            raise ValueError(f'"record" must be {RECORD_FORMAT!r}, got {data.get("record")!r}')
        options = data.get("options")
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise ValueError("options must be a list of option names")
        n = len(options)
        agreed = tuple(None if data.get(k) is None else str(data.get(k)) for k in AGREED)
        return Record(
            source,
            _text(data, "decision_id"),
            _time(data.get("time")),
            _text(data, "api"),
            _text(data, "question_type"),
            tuple(options),
            _numbers(data.get("raw_probabilities"), "raw_probabilities", n),
            _numbers(data.get("probabilities"), "probabilities", n),
            _optional_number(data, "confidence") or 0.0,
            _optional_number(data, "label_mass"),
            data.get("route"),
            _optional_number(data, "threshold"),
            agreed,
            data,
        )
    except ValueError as exc:
        raise RecordError(f"{source}: {exc}") from exc


def _label(ground: Any) -> Any:
    if not isinstance(ground, dict) or not isinstance(ground.get("data"), str):
        raise ValueError('groundTruthData must be an object with a string "data"')
    data, encoding = ground["data"], ground.get("encoding")
    if encoding == "CSV":
        rows = list(csv.reader([data]))
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
            raise ValueError("eventMetadata.eventId must be the decision id (a string)")
        version = data.get("eventVersion", "0")
        if not isinstance(version, str):
            raise ValueError(f"eventVersion must be a string, got {version!r}")
        return Outcome(source, event, _label(data.get("groundTruthData")))
    except ValueError as exc:
        raise RecordError(f"{source}: {exc}") from exc


def _unique(items: Iterable[Any], what: str) -> list[Any]:
    seen: dict[str, str] = {}
    out = []
    for item in items:
        first = seen.setdefault(item.decision_id, item.source)
        if first != item.source:
            raise RecordError(
                f"{item.source}: decision id {item.decision_id!r} again ({what} first at {first})"
            )
        out.append(item)
    return out


def load_records(paths: Iterable[Path | str]) -> list[Record]:
    """Every record of the files, in file order; a decision id seen twice is refused."""
    return _unique((parse_record(d, s) for s, d in _lines(paths)), "its record is")


def load_outcomes(paths: Iterable[Path | str]) -> list[Outcome]:
    """Every outcome of the files, in file order; two outcomes for one decision are refused."""
    return _unique((parse_outcome(d, s) for s, d in _lines(paths)), "its outcome is")


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
    unmatched: list[Outcome]  # outcomes whose decision id no record has
    unknown_option: list[tuple[Outcome, Record]]  # outcomes naming an option the record lacks
    left_out: Counter[str]  # records of other APIs, by API
    left_out_outcomes: int = 0  # outcomes of those records

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
        if self.left_out:
            parts.append(
                "left out: "
                + ", ".join(f"{n} {api} records" for api, n in sorted(self.left_out.items()))
                + f" ({self.left_out_outcomes} outcomes)"
            )
        return "; ".join(parts)


def join(records: Sequence[Record], outcomes: Sequence[Outcome]) -> Joined:
    """Pair outcomes with records by decision id (module docstring); records of APIs outside
    ``FITTED_APIS`` are left out (and counted), as are the outcomes naming them."""
    left_out = Counter(r.api for r in records if r.api not in FITTED_APIS)
    by_id = {r.decision_id: r for r in records}
    pairs, unmatched, unknown = [], [], []
    labelled: set[str] = set()
    skipped = 0
    for outcome in outcomes:
        record = by_id.get(outcome.decision_id)
        if record is None:
            unmatched.append(outcome)
            continue
        if record.api not in FITTED_APIS:
            skipped += 1
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
        pairs, len(records), len(outcomes), without, unmatched, unknown, left_out, skipped
    )


def group_key(record: Record) -> tuple[str | None, ...]:
    """What must agree between records fitted together: the values of ``AGREED``."""
    return record.agreed


def disagreement(records: Sequence[Record]) -> str | None:
    """None when the records agree on every field of ``AGREED``; else a sentence naming each
    field that differs with every value and how many records hold it (most first)."""
    parts = []
    for i, name in enumerate(AGREED):
        counts = Counter(r.agreed[i] for r in records)
        if len(counts) > 1:
            values = ", ".join(
                f"{v!r} ({n} records)"
                for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
            )
            parts.append(f"{name}: {values}")
    if not parts:
        return None
    return "the records differ in " + "; ".join(parts)


def outcome_line(decision_id: str, option: str) -> dict[str, Any]:
    """An outcome naming ``option`` for ``decision_id``, in Model Monitor's shape (JSON
    encoding: the option name as a JSON string, whatever characters it holds)."""
    return {
        "groundTruthData": {"data": json.dumps(option, ensure_ascii=False), "encoding": "JSON"},
        "eventMetadata": {"eventId": decision_id},
        "eventVersion": "0",
    }


def write_outcomes(path: Path | str, labels: Iterable[tuple[str, str]]) -> int:
    """Write (decision id, option name) pairs as outcomes, in the order given; their count."""
    lines = [json.dumps(outcome_line(d, o), ensure_ascii=False) + "\n" for d, o in labels]
    Path(path).write_text("".join(lines), encoding="utf-8")
    return len(lines)
