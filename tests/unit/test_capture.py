"""semif_tools/capture.py: a SageMaker Data Capture file (tests/data/capture, written by hand
in AWS's documented format) read into the decision records its answers carry, with exact
values, and the command that writes them."""

from __future__ import annotations

import base64
from collections import Counter
from pathlib import Path

import orjson
import pytest

from semif_tools import capture

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "tests" / "data" / "capture"
FILE = FOLDER / "semif" / "AllTraffic" / "2026" / "12" / "03" / "10" / "capture-1.jsonl"


def record(**fields):
    """A record as the fixture's answers carry it: these fields over a chat decision's."""
    return {
        "record": "semif.decision/1",
        "decision_id": "r1",
        "request_id": "r1",
        "question_id": None,
        "time": "2026-12-03T10:11:12.345Z",
        "api": "chat",
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "llama_build": "b11434",
        "prompt_format_version": "semif-1",
        "layout": "conversation_first",
        "read_scheme": "prefix-63",
        "prompt_tokens": 96,
        "prompt_hash": "hmac-sha256:" + "ab" * 32,
        "question_type": "choice",
        "options": ["positive", "negative"],
        "raw_probabilities": [0.7, 0.30000000000000004],
        "probabilities": [0.6812, 0.3188],
        "choice": "positive",
        "confidence": 0.3624,
        "label_mass": 0.91,
        "profile": "sentiment",
        "calibration_method": "temperature",
        "threshold": 0.3,
        "route": "auto",
        "route_reason": "confidence 0.3624 >= threshold 0.3",
        "debias": None,
        "repeatable": True,
        "latency_ms": 41.5,
        **fields,
    }


UNCALIBRATED = {
    "profile": None,
    "calibration_method": None,
    "threshold": None,
    "route": None,
    "route_reason": None,
}
NOUL = {"question_type": "noul", "options": ["true", "false"]}
RERANK = {
    "api": "rerank",
    "question_type": "score",
    "options": ["0", "1"],
    "label_mass": 0.99,
    "prompt_hash": None,
    "request_id": "rr-9",
    **UNCALIBRATED,
}
JSONLINES = {"request_id": "batch-1", "api": "invocations", "time": "2026-12-03T10:13:30.700Z"}

EXPECTED = [
    (
        record(decision_id="chat-7", request_id="chat-7"),
        ("9f1b0a52-6c1e-4a53-9d7e-2b4f0c8e1a01", "chat-7", "2026-12-03T10:11:12Z"),
    ),
    (
        record(
            decision_id="a1b2c3/sentiment",
            request_id="a1b2c3",
            question_id="sentiment",
            api="system_one",
            time="2026-12-03T10:12:00.001Z",
            latency_ms=88.25,
        ),
        ("0c3d6e7f-1a2b-4c5d-8e9f-a0b1c2d3e4f5", None, "2026-12-03T10:12:00Z"),
    ),
    (
        record(
            decision_id="a1b2c3/refund",
            request_id="a1b2c3",
            question_id="refund",
            api="system_one",
            raw_probabilities=[0.25, 0.75],
            probabilities=[0.25, 0.75],
            choice="false",
            confidence=0.5,
            label_mass=0.88,
            time="2026-12-03T10:12:00.001Z",
            latency_ms=88.25,
            **NOUL,
            **UNCALIBRATED,
        ),
        ("0c3d6e7f-1a2b-4c5d-8e9f-a0b1c2d3e4f5", None, "2026-12-03T10:12:00Z"),
    ),
    (
        record(
            decision_id="d-42",
            request_id="d-42",
            api="decisions",
            question_type="noul",
            options=["true", "false"],
            raw_probabilities=[0.125, 0.875],
            probabilities=[0.2, 0.8],
            choice="false",
            confidence=0.6,
            label_mass=0.97,
            route="review",
            route_reason="confidence 0.6 < threshold 0.65",
            threshold=0.65,
            profile="tickets-yn",
        ),
        ("5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9", "d-42", "2026-12-03T10:12:30Z"),
    ),
    (
        record(
            decision_id="rr-9/0",
            question_id="0",
            raw_probabilities=[0.1, 0.9],
            probabilities=[0.1, 0.9],
            choice="1",
            confidence=0.8,
            **RERANK,
        ),
        ("6a7b8c9d-0e1f-4a2b-b3c4-d5e6f7a8b9c0", None, "2026-12-03T10:13:00Z"),
    ),
    (
        record(
            decision_id="rr-9/1",
            question_id="1",
            raw_probabilities=[0.6, 0.4],
            probabilities=[0.6, 0.4],
            choice="0",
            confidence=0.2,
            **RERANK,
        ),
        ("6a7b8c9d-0e1f-4a2b-b3c4-d5e6f7a8b9c0", None, "2026-12-03T10:13:00Z"),
    ),
    (
        record(**{**JSONLINES, "decision_id": "batch-1/0", "time": "2026-12-03T10:13:30.500Z"}),
        ("7b8c9d0e-1f2a-4b3c-c4d5-e6f7a8b9c0d1", None, "2026-12-03T10:13:31Z"),
    ),
    (
        record(decision_id="batch-1/2/tone", question_id="tone", **JSONLINES),
        ("7b8c9d0e-1f2a-4b3c-c4d5-e6f7a8b9c0d1", None, "2026-12-03T10:13:31Z"),
    ),
    (
        record(
            decision_id="batch-1/2/urgent",
            question_id="urgent",
            raw_probabilities=[0.9, 0.1],
            probabilities=[0.9, 0.1],
            choice="true",
            confidence=0.8,
            **NOUL,
            **JSONLINES,
        ),
        ("7b8c9d0e-1f2a-4b3c-c4d5-e6f7a8b9c0d1", None, "2026-12-03T10:13:31Z"),
    ),
]


def test_the_recorded_capture_gives_every_record_with_its_capture_ids():
    counts: Counter[str] = Counter()
    with FILE.open("rb") as f:
        found = list(capture.read_capture(f, counts))
    got = [(c.record, (c.event_id, c.inference_id, c.inference_time)) for c in found]
    assert got == EXPECTED
    # the floats as the proxy wrote them, bit for bit (orjson's shortest repr round-trips)
    assert found[0].record["raw_probabilities"][1] == 0.30000000000000004
    # six events; the jsonlines answer is three answers, one an error record, and the
    # relayed generation carries no record either
    assert counts == Counter(events=6, no_output=0, answers=8, no_record=2, records=9, unreadable=0)


def test_the_command_writes_the_records_with_the_capture_beside_them(tmp_path, capsys):
    out = tmp_path / "records.jsonl"
    assert capture.main([str(FOLDER), "--out", str(out)]) == 0
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [line.pop("capture") for line in lines] == [
        {"event_id": e, "inference_id": i, "inference_time": t} for _, (e, i, t) in EXPECTED
    ]
    assert lines == [r for r, _ in EXPECTED]
    err = capsys.readouterr().err
    assert "6 events in 1 files, 9 records from 8 answers" in err
    assert "2 answers without a record" in err


@pytest.mark.parametrize(
    ("answer", "decision_ids"),
    [
        ({"semif": {"record": record(decision_id="c")}}, ["c"]),
        ({"answers": {"q": {"x_record": record(decision_id="s/q")}}}, ["s/q"]),
        ({"answers": [{"x_record": record(decision_id="d")}, {"value": True}]}, ["d"]),
        ({"results": [{"index": 1}], "x_records": [record(decision_id="r/1")]}, ["r/1"]),
        ({"results": [{"x_record": record(decision_id="r/2")}]}, ["r/2"]),
        ({"semif": {"choice": "a"}}, []),  # records off
        ({"answers": {"q": {"x_record": {"record": "semif.decision/2"}}}}, []),  # not version 1
        ({"error": {"status": 504}}, []),
        ([1, 2], []),
    ],
)
def test_answer_records_walks_each_answer_shape(answer, decision_ids):
    assert [r["decision_id"] for r in capture.answer_records(answer)] == decision_ids


def event(output: dict | None, **meta) -> bytes:
    data = {"captureData": {} if output is None else {"endpointOutput": output}}
    return orjson.dumps({**data, "eventMetadata": meta, "eventVersion": "0"})


ANSWER = orjson.dumps({"semif": {"record": record(decision_id="x")}})


@pytest.mark.parametrize(
    "output",
    [
        {"observedContentType": "application/json", "data": ANSWER.decode(), "encoding": "JSON"},
        {
            "observedContentType": "application/json; charset=utf-8",
            "data": ANSWER.decode(),
            "encoding": "JSON",
        },
        {
            "observedContentType": "application/json",
            "data": orjson.loads(ANSWER),
            "encoding": "JSON",
        },
        {
            "observedContentType": "application/octet-stream",
            "data": base64.b64encode(ANSWER).decode(),
            "encoding": "BASE64",
        },
        {
            "observedContentType": "application/jsonlines",
            "data": ANSWER.decode() + "\n\n",
            "encoding": "JSON",
        },
    ],
)
def test_each_encoding_is_read(output):
    found = list(capture.read_capture([event(output, eventId="e")]))
    assert [(c.record["decision_id"], c.event_id, c.inference_id) for c in found] == [
        ("x", "e", None)
    ]


def test_an_event_without_its_output_is_counted_not_read():
    counts: Counter[str] = Counter()
    assert list(capture.read_capture([event(None, eventId="e")], counts)) == []
    assert (counts["events"], counts["no_output"]) == (1, 1)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"{not json", "not a Data Capture event"),
        (b'{"eventMetadata": {}}', "not a Data Capture event"),
        (event({"data": "%%%", "encoding": "BASE64"}), "not base64"),
        (event({"data": "1,2", "encoding": "CSV", "observedContentType": "text/csv"}), "not JSON"),
        (event({"data": "x", "encoding": "GZIP"}), "cannot be read"),
    ],
)
def test_an_unreadable_line_is_said_and_skipped(line, problem):
    good = event(
        {"observedContentType": "application/json", "data": ANSWER.decode(), "encoding": "JSON"}
    )
    with pytest.raises(capture.CaptureError, match=f"line 1: .*{problem}"):
        list(capture.read_capture([line, good]))
    problems: list[str] = []
    found = list(capture.read_capture([line, good], problems=problems))
    assert [c.record["decision_id"] for c in found] == ["x"]  # the next line is still read
    assert len(problems) == 1 and problems[0].startswith("line 1: ")


def test_the_command_exits_1_when_a_line_is_skipped(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"{not json\n" + FILE.read_bytes())
    out = tmp_path / "records.jsonl"
    assert capture.main([str(bad), "--out", str(out)]) == 1
    assert len(out.read_bytes().splitlines()) == len(EXPECTED)
    assert f"{bad}: line 1: not a Data Capture event: skipped" in capsys.readouterr().err


def test_a_missing_file_is_refused(tmp_path, capsys):
    assert capture.main([str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
