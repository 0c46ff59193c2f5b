"""Decision records and their outcomes, read back offline (the outcomes: ``outcomes.py``).

A record file is JSON lines, one ``semif.decision/1`` object per decision (``DecisionRecord``,
proxy/protocol/records.py: the model the proxy writes with is the one read here), as the
proxy writes them (``--decision-records``) or as ``records-from-capture`` reads them out of
SageMaker Data Capture (each with a ``capture`` object of the capture's ids beside its
fields). An outcomes file is JSON lines in SageMaker Model Monitor's ground-truth shape
(AWS's "Ingest Ground Truth labels and merge them with predictions",
https://docs.aws.amazon.com/sagemaker/latest/dg/model-monitor-model-quality-merge.html)::

    {"groundTruthData": {"data": "billing", "encoding": "CSV"},
     "eventMetadata": {"eventId": "<key>"}, "eventVersion": "0"}

``encoding`` "CSV" (what AWS documents, and what ``write_outcomes`` writes): ``data`` is one
CSV field naming the option, quoted as the csv module quotes it, so that an option holding
commas, quotes or line breaks reads back whole; "JSON": ``data`` is a JSON text (a string
naming the option, ``true``/``false`` for a yes/no question, a level index for a score). Blank
lines are skipped in both; any other line that is not such an object is a ``RecordError``
naming the file and the line. Wherever a file is named, a folder may be (``files.py``: every
``*.jsonl`` under it, in path order, which is date order in AWS's ``yyyy/mm/dd/hh`` layout).

``eventId``, the outcome's key, names its decision by any of ``join_keys``: the decision id;
or, for a record read from Data Capture, the capture's ``inferenceId`` or its ``eventId``,
followed by the decision's place in its invocation when the invocation held several (the
decision id from its first ``/`` on: ``<eventId>/<question id>``, ``<eventId>/<line>``,
``<eventId>/<line>/<question id>``).

``load_records`` keeps one record per decision id: of records repeating an id (a client's
retry reusing its InferenceId, a capture file read twice) the **last** read is kept (files in
the order given, a folder's in date order: the latest answer, the one the client most likely
acted on), and the others are counted; where they differ in ``prompt_hash`` or ``options`` the
id named two decisions, and all of its records are left out and counted. ``disagreement``
says which of ``AGREED`` differ between records.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from proxy.protocol.records import RECORD, DecisionRecord

from .files import data_files

__all__ = [
    "RECORD_FORMAT",
    "AGREED",
    "FITTED_APIS",
    "RecordError",
    "Record",
    "Loaded",
    "json_lines",
    "join_keys",
    "parse_record",
    "unique_records",
    "load_records",
    "disagreement",
    "group_key",
]

RECORD_FORMAT = RECORD  # the proxy's, proxy/protocol/records.py
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
    keys: tuple[str, ...]  # what an outcome may name it by (join_keys)
    fields: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    def read(self) -> tuple[float, ...]:
        """The raw probabilities as calibrate reads them: a yes/no answer as (P(true),
        1 - P(true)), as read.py makes it from the served P(true); others as recorded."""
        probs = self.raw_probabilities
        return (probs[0], 1.0 - probs[0]) if self.question_type == "noul" else probs

    def value(self, name: str) -> str | None:
        """One of ``AGREED``'s values."""
        return self.agreed[AGREED.index(name)]


def json_lines(paths: Iterable[Path | str]) -> Iterator[tuple[str, Any]]:
    """(``file:line``, the line's JSON) for each non-blank line of the files and folders
    (``files.py``); a line that is not JSON is a ``RecordError``."""
    for path in data_files(paths):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                source = f"{path}:{number}"
                try:
                    yield source, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RecordError(f"{source}: not JSON: {exc}") from exc


def _time(value: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"time {value!r} is not ISO 8601") from exc
    if when.tzinfo is None:
        raise ValueError(f"time {value!r} has no time zone (records are UTC, ending in Z)")
    return when.astimezone(dt.UTC)


def _refusal(exc: ValidationError) -> str:
    """The first thing the model refused, named by its field: ``options.2: ...``."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the record"
    if first["type"] == "missing":
        return f"{where} is missing"
    return f"{where}: {first['msg']} (got {first['input']!r})"


def _decision_record(data: dict[str, Any]) -> DecisionRecord:
    """``data`` validated by the proxy's own model of the record (strictly: a number is
    a number, not a string or a boolean); the probabilities one per option."""
    if data.get("record") != RECORD_FORMAT:
        raise ValueError(f'"record" must be {RECORD_FORMAT!r}, got {data.get("record")!r}')
    try:
        record = DecisionRecord.model_validate(data, strict=True)
    except ValidationError as exc:
        raise ValueError(_refusal(exc)) from exc
    n = len(record.options)
    for name in ("raw_probabilities", "probabilities"):
        if len(getattr(record, name)) != n:
            raise ValueError(f"{name} must be a list of {n} numbers (one per option)")
    return record


def join_keys(decision_id: str, capture: Any = None) -> tuple[str, ...]:
    """What an outcome may name a decision by: its decision id; and, where ``capture`` is
    records-from-capture's object of the capture's ids, the capture's ``inference_id`` and
    ``event_id``, each followed by the decision's place in its invocation, which is the
    decision id from its first ``/`` on (nothing for an invocation of one decision;
    ``/<question id>``, ``/<line>`` or ``/<line>/<question id>`` otherwise: a decision id's
    request part holds no ``/``, proxy/recorder.py's ``escape_id``)."""
    _, slash, place = decision_id.partition("/")
    keys = [decision_id]
    if isinstance(capture, dict):
        for name in ("inference_id", "event_id"):
            value = capture.get(name)
            if isinstance(value, str) and value:
                keys.append(value + slash + place)
    return tuple(dict.fromkeys(keys))


def parse_record(data: Any, source: str = "<record>") -> Record:
    """One record read through ``DecisionRecord`` (proxy/protocol/records.py, the model the
    proxy writes with); a record it refuses is a ``RecordError`` naming ``source`` and the
    field."""
    try:
        if not isinstance(data, dict):
            raise ValueError("each line must be a JSON object")
        record = _decision_record(data)
        agreed = tuple(None if data.get(k) is None else str(data.get(k)) for k in AGREED)
        return Record(
            source,
            record.decision_id,
            _time(record.time),
            record.api,
            record.question_type,
            tuple(record.options),
            tuple(record.raw_probabilities),
            tuple(record.probabilities),
            record.confidence,
            record.label_mass,
            record.route,
            record.threshold,
            agreed,
            join_keys(record.decision_id, data.get("capture")),
            data,
        )
    except ValueError as exc:
        raise RecordError(f"{source}: {exc}") from exc


@dataclass(frozen=True)
class Loaded:
    """The records of one decision id each (module docstring), and what was left out."""

    records: list[Record]
    read: int  # records read, repeats included
    repeated: int  # records a later record of the same decision id replaced
    conflicting_ids: list[str]  # decision ids whose records differ: all of them left out
    conflicting: int  # the records of those ids
    first_conflict: str | None = None  # where the first such id's second record was read

    def summary(self) -> str:
        """What loading left out, in words ("" when nothing)."""
        parts = []
        if self.repeated:
            parts.append(
                f"{self.repeated} records repeat a decision id read again later (the last "
                "of each kept)"
            )
        if self.conflicting_ids:
            parts.append(
                f"{len(self.conflicting_ids)} decision ids name records that differ in "
                f"prompt_hash or options: their {self.conflicting} records left out (first: "
                f"{self.conflicting_ids[0]!r} at {self.first_conflict})"
            )
        return "; ".join(parts)


def _same_decision(a: Record, b: Record) -> bool:
    """Whether two records of one decision id are one decision asked again: the same
    ``prompt_hash`` and the same options."""
    return a.fields.get("prompt_hash") == b.fields.get("prompt_hash") and a.options == b.options


def unique_records(records: Sequence[Record]) -> Loaded:
    """One record per decision id, the last of each (module docstring), in read order."""
    groups: dict[str, list[Record]] = {}
    for record in records:
        groups.setdefault(record.decision_id, []).append(record)
    kept: set[int] = set()
    conflicting_ids, conflicting, first = [], 0, None
    for decision_id, group in groups.items():
        if all(_same_decision(group[0], other) for other in group[1:]):
            kept.add(id(group[-1]))
            continue
        conflicting_ids.append(decision_id)
        conflicting += len(group)
        if first is None:
            first = next(o.source for o in group[1:] if not _same_decision(group[0], o))
    out = [r for r in records if id(r) in kept]
    repeated = len(records) - len(out) - conflicting
    return Loaded(out, len(records), repeated, conflicting_ids, conflicting, first)


def load_records(paths: Iterable[Path | str]) -> Loaded:
    """The records of the files and folders (``files.py``), one per decision id
    (``unique_records``); a line that is no record is a ``RecordError``."""
    return unique_records([parse_record(d, s) for s, d in json_lines(paths)])


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
