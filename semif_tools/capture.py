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
bytes, for content types the endpoint configuration did not declare). The deploy code tells
the proxy ``PROXY_DECISION_RECORDS=answer``, so each captured answer carries the records of
its decisions (``answer_records`` walks the answers' shapes); this command writes them as
JSON lines, in file and line order, each with the capture's ids beside it::

    {...the record..., "capture": {"event_id", "inference_id" (null when none), "inference_time"}}

Model Monitor merges ground truth on ``inferenceId`` when the capture has one, else on
``eventId``; the proxy's decision ids are in the records. CAPTURE may name files or folders
(every ``*.jsonl`` under them, in path order, which is time order in SageMaker's layout).
Requests, when captured, are not read: a record holds an input only if the proxy was told to
keep it. A summary goes to stderr, and each line that could not be read (skipped); the exit
status is then 1.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "CaptureError",
    "Captured",
    "RECORD",
    "answer_records",
    "answers",
    "body",
    "capture_files",
    "main",
    "read_capture",
]

RECORD = "semif.decision/1"  # the records this reads (the "record" field)
JSONLINES = frozenset({"application/jsonlines", "application/jsonl", "application/x-jsonlines"})


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
    answer (``answers[]``) (and in ``results[]``). Anything else (an error record, a relayed
    generation, an answer made with records off) carries none."""
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


def answers(part: dict[str, Any]) -> list[Any]:
    """The answers in a captured output: one JSON body, or one per line of a jsonlines body
    (the ``/invocations`` answer to a jsonlines request)."""
    raw = body(part)
    content_type = str(part.get("observedContentType", "")).partition(";")[0].strip().lower()
    try:
        if content_type in JSONLINES:
            return [orjson.loads(line) for line in raw.splitlines() if line.strip()]
        return [orjson.loads(raw)]
    except orjson.JSONDecodeError as exc:
        raise CaptureError(f"the captured {content_type or 'output'} is not JSON: {exc}") from exc


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


def capture_files(paths: Sequence[Path]) -> list[Path]:
    """The files named, and every ``*.jsonl`` under the folders named, in path order."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    return files


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m semif_tools records-from-capture", description=__doc__.splitlines()[0]
    )
    p.add_argument("capture", type=Path, nargs="+", help="Data Capture .jsonl files or folders")
    p.add_argument("--out", type=Path, help="records as JSON lines (default: stdout)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    files = capture_files(args.capture)
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"records-from-capture: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    counts: Counter[str] = Counter()
    failed: list[str] = []
    out = args.out.open("wb") if args.out else sys.stdout.buffer
    try:
        for path in files:
            problems: list[str] = []
            with path.open("rb") as f:
                for captured in read_capture(f, counts, problems):
                    out.write(captured.line())
            failed += [f"{path}: {problem}" for problem in problems]
    finally:
        if args.out:
            out.close()
    print(
        f"records-from-capture: {counts['events']} events in {len(files)} files, "
        f"{counts['records']} records from {counts['answers']} answers; "
        f"{counts['no_output']} events without an answer, "
        f"{counts['no_record']} answers without a record"
        + (" (is PROXY_DECISION_RECORDS=answer set?)" if counts["no_record"] else ""),
        file=sys.stderr,
    )
    for message in failed:
        print(f"records-from-capture: {message}: skipped", file=sys.stderr)
    return 1 if failed else 0
