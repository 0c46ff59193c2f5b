"""``python -m semif_tools records-from-capture CAPTURE... [--out records.jsonl]``: decision
records from SageMaker Data Capture files.

With Data Capture on (``python -m deploy create ... --capture s3://...``), SageMaker writes a
sampled share of the invocations to S3, ``<DestinationS3Uri>/<endpoint>/<variant>/yyyy/mm/dd/
hh/<file>.jsonl``, one JSON line per invocation (AWS's "Capture data from real-time endpoint"
page, docs/sagemaker.md):

    {"captureData": {
        "endpointInput": {"observedContentType", "mode": "INPUT", "data", "encoding"},
        "endpointOutput": {"observedContentType", "mode": "OUTPUT", "data", "encoding"}},
     "eventMetadata": {"eventId", "inferenceId" (when the caller passed one), "inferenceTime"},
     "eventVersion": "0"}

``encoding`` is ``JSON`` or ``CSV`` (``data`` is the body's text) or ``BASE64`` (the body's
bytes, for content types the endpoint configuration did not declare, ``text/event-stream``
among them). The deploy code tells the proxy ``PROXY_DECISION_RECORDS=answer``, so each
captured answer carries the records of its decisions (``answer_records`` walks the answers'
shapes; a streamed answer, ``text/event-stream``, is read as the JSON chunks its events carry,
``sse_data``); this command writes them as JSON lines, in file and line order, each with the
capture's ids beside it::

    {...the record..., "capture": {"event_id", "inference_id" (null when none), "inference_time"}}

Those ids are what an outcome may name a decision by besides its decision id
(``records.join_keys``: ``<inferenceId>`` or ``<eventId>``, with ``/<question id>`` after it
for an invocation of several decisions). CAPTURE may name files or folders (``files.py``:
every ``*.jsonl`` under them, in path order, which is time order in SageMaker's layout).
Requests, when captured, are not read: a record holds an input only if the proxy was told to
keep it. A summary goes to stderr; a line that is not a Data Capture event this can read is
skipped, counted and named there (the first ``SHOWN``), and the others are still read: the
exit status is 0 unless a file cannot be opened (2).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.protocol.records import RECORD

from .files import data_files

__all__ = [
    "CaptureError",
    "Captured",
    "RECORD",
    "answer_records",
    "answers",
    "body",
    "sse_data",
    "main",
    "read_capture",
]

JSONLINES = frozenset({"application/jsonlines", "application/jsonl", "application/x-jsonlines"})
EVENT_STREAM = "text/event-stream"
SHOWN = 20  # skipped lines named on stderr, at most
_LINE_END = re.compile(rb"\r\n|\r|\n")


class CaptureError(ValueError):
    """A capture line that is not a Data Capture event this can read."""


@dataclass(frozen=True)
class Captured:
    """One decision record from a captured answer, with the capture's ids."""

    record: dict[str, Any]
    event_id: str | None
    inference_id: str | None
    inference_time: str | None

    def line(self) -> bytes:
        """The output line: the record with ``capture`` beside its own fields."""
        ids = {
            "event_id": self.event_id,
            "inference_id": self.inference_id,
            "inference_time": self.inference_time,
        }
        return orjson.dumps({**self.record, "capture": ids}) + b"\n"


def answer_records(answer: Any) -> list[dict[str, Any]]:
    """The decision records one answer carries, in the answer's order: a chat answer's
    ``semif.record``; a rerank answer's ``x_records`` (every document's, in the documents'
    order); each entry's ``x_record`` in a System One answer (``answers{}``) or a Decisions
    answer (``answers[]``) (and in ``results[]``); a streamed answer (the list of its chunks)
    the records of its chunks, in order. Anything else (an error record, a relayed
    generation, streamed or not, an answer made with records off) carries none."""
    if isinstance(answer, list):
        return [r for chunk in answer if isinstance(chunk, dict) for r in answer_records(chunk)]
    if not isinstance(answer, dict):
        return []
    semif = answer.get("semif")
    found = [semif.get("record")] if isinstance(semif, dict) else []
    if isinstance(answer.get("x_records"), list):
        found += answer["x_records"]
    entries = answer.get("answers", answer.get("results"))
    if isinstance(entries, dict):
        entries = list(entries.values())
    if isinstance(entries, list):
        found += [entry.get("x_record") for entry in entries if isinstance(entry, dict)]
    return [r for r in found if isinstance(r, dict) and r.get("record") == RECORD]


def body(part: dict[str, Any]) -> bytes:
    """A captured body's bytes from its ``data`` and ``encoding``."""
    data, encoding = part.get("data"), str(part.get("encoding", "")).upper()
    if encoding == "BASE64" and isinstance(data, str):
        try:
            return base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise CaptureError(f"data is not base64: {exc}") from exc
    if encoding in ("JSON", "CSV") and isinstance(data, str):
        return data.encode()
    if encoding == "JSON" and isinstance(data, dict | list):  # already parsed
        return orjson.dumps(data)
    raise CaptureError(f"data of encoding {part.get('encoding')!r} cannot be read")


def sse_data(raw: bytes) -> list[bytes]:
    """The data of each event in a ``text/event-stream`` body, in order (the HTML standard's
    parsing: lines end at CRLF, LF or CR; an event ends at a blank line; its ``data`` lines'
    values, after the colon and one optional space, joined by LF; comments and other fields
    ignored), without OpenAI's closing ``[DONE]``. An event the body ends in without its
    blank line counts too (a captured body holds the whole answer)."""
    events: list[bytes] = []
    data: list[bytes] = []
    for line in [*_LINE_END.split(raw), b""]:
        if not line:
            if data:
                events.append(b"\n".join(data))
            data = []
            continue
        name, _, value = line.partition(b":")
        if name == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    return [event for event in events if event.strip() != b"[DONE]"]


def answers(part: dict[str, Any]) -> list[Any]:
    """The answers in a captured output: one JSON body; one per line of a jsonlines body (the
    ``/invocations`` answer to a jsonlines request); or one streamed answer, the list of the
    JSON chunks a ``text/event-stream`` body's events carry (a body of another or no declared
    type whose text starts with ``data:`` is read as one too)."""
    raw = body(part)
    content_type = str(part.get("observedContentType", "")).partition(";")[0].strip().lower()
    streamed = content_type == EVENT_STREAM or raw.lstrip().startswith(b"data:")
    try:
        if streamed:
            return [[orjson.loads(data) for data in sse_data(raw)]]
        if content_type in JSONLINES:
            return [orjson.loads(line) for line in raw.splitlines() if line.strip()]
        return [orjson.loads(raw)]
    except orjson.JSONDecodeError as exc:
        what = EVENT_STREAM if streamed else content_type or "output"
        raise CaptureError(f"the captured {what} is not JSON: {exc}") from exc


def read_capture(
    lines: Iterable[str | bytes],
    counts: Counter[str] | None = None,
    problems: list[str] | None = None,
) -> Iterator[Captured]:
    """The records in a capture file's lines. ``counts`` (when given) gets ``events``,
    ``no_output`` (events captured without their answer), ``answers``, ``no_record``
    (answers carrying none), ``records`` and ``unreadable``. A line that is not a readable
    event raises ``CaptureError`` naming its line number (from 1), or, when ``problems`` is
    given, is said there and skipped."""
    counts = Counter() if counts is None else counts
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            found, meta = _event(line)
        except CaptureError as exc:
            counts["unreadable"] += 1
            if problems is None:
                raise CaptureError(f"line {number}: {exc}") from exc
            problems.append(f"line {number}: {exc}")
            continue
        counts["events"] += 1
        if found is None:
            counts["no_output"] += 1
            continue
        for answer in found:
            counts["answers"] += 1
            records = answer_records(answer)
            counts["no_record"] += not records
            for record in records:
                counts["records"] += 1
                yield Captured(
                    record, meta.get("eventId"), meta.get("inferenceId"), meta.get("inferenceTime")
                )


def _event(line: str | bytes) -> tuple[list[Any] | None, dict[str, Any]]:
    """One capture line's answers (None when its output was not captured) and metadata."""
    try:
        event = orjson.loads(line)
        output = event["captureData"].get("endpointOutput")
        meta = event.get("eventMetadata") or {}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CaptureError("not a Data Capture event") from exc
    if not isinstance(meta, dict):
        raise CaptureError("eventMetadata is not an object")
    return (None if output is None else answers(output)), meta


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m semif_tools records-from-capture", description=__doc__.splitlines()[0]
    )
    p.add_argument("capture", type=Path, nargs="+", help="Data Capture .jsonl files or folders")
    p.add_argument("--out", type=Path, help="records as JSON lines (default: stdout)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        files = data_files(args.capture)
    except (OSError, ValueError) as exc:
        print(f"records-from-capture: {exc}", file=sys.stderr)
        return 2
    counts: Counter[str] = Counter()
    skipped: list[str] = []
    out = args.out.open("wb") if args.out else sys.stdout.buffer
    try:
        for path in files:
            problems: list[str] = []
            with path.open("rb") as f:
                for captured in read_capture(f, counts, problems):
                    out.write(captured.line())
            skipped += [f"{path}: {problem}" for problem in problems]
    finally:
        if args.out:
            out.close()
    print(
        f"records-from-capture: {counts['events']} events in {len(files)} files, "
        f"{counts['records']} records from {counts['answers']} answers; "
        f"{counts['no_output']} events without an answer, "
        f"{counts['no_record']} answers without a record"
        + (" (is PROXY_DECISION_RECORDS=answer set?)" if counts["no_record"] else "")
        + f"; {counts['unreadable']} lines skipped",
        file=sys.stderr,
    )
    for message in skipped[:SHOWN]:
        print(f"records-from-capture: {message}: skipped", file=sys.stderr)
    if len(skipped) > SHOWN:
        print(f"records-from-capture: and {len(skipped) - SHOWN} more skipped", file=sys.stderr)
    return 0
