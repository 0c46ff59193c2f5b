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
from tests.data.aws_samples import AWS_CAPTURE

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
        "route_reason": "above_threshold",
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
            route_reason="below_threshold",
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


def test_a_skipped_line_is_counted_and_named_not_fatal(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"{not json\n" + FILE.read_bytes() + b'{"eventMetadata": {}}\n')
    out = tmp_path / "records.jsonl"
    assert capture.main([str(bad), "--out", str(out)]) == 0
    assert len(out.read_bytes().splitlines()) == len(EXPECTED)
    err = capsys.readouterr().err
    assert "6 events in 1 files, 9 records from 8 answers" in err
    assert "; 2 lines skipped" in err
    assert f"{bad}: line 1: not a Data Capture event: skipped" in err
    assert f"{bad}: line 8: not a Data Capture event: skipped" in err


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nope.jsonl", "nope.jsonl: no such file or folder"),
        ("empty", "empty: no *.jsonl file in this folder or under it"),
        ("s3://bucket/capture/", "s3:// URIs are not read directly"),
    ],
)
def test_a_missing_file_is_refused(tmp_path, capsys, name, message):
    (tmp_path / "empty").mkdir()
    path = name if name.startswith("s3:") else str(tmp_path / name)
    assert capture.main([path]) == 2
    assert message in capsys.readouterr().err


# -- streamed answers (text/event-stream) ------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "data"),
    [
        (b'data: {"a":1}\n\ndata: [DONE]\n\n', [b'{"a":1}']),
        (b'data:{"a":1}\r\n\r\ndata: {"b":2}\r\rdata: [DONE]', [b'{"a":1}', b'{"b":2}']),
        (b": a comment\nevent: x\nid: 3\ndata: 1\ndata: 2\n\n", [b"1\n2"]),  # data lines join
        (b'data: {"a":1}', [b'{"a":1}']),  # ends without its blank line: still an event
        (b"data:  two spaces\n\n", [b" two spaces"]),  # one space dropped, not two
        (b"\n\n\n", []),
        (b"data: [DONE]\n\n", []),
    ],
)
def test_sse_data_is_each_events_data(raw, data):
    assert capture.sse_data(raw) == data


# The proxy's streamed chat decision, as proxy/routes/chat.py writes it
# (stream_options.include_usage: the answer's chunk, then the usage chunk without semif)
STREAMED_CHUNKS = [
    {
        "id": "chatcmpl-s-1",
        "object": "chat.completion.chunk",
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": "positive"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "semif": {"choice": "positive", "decision_id": "s-1", "record": record(decision_id="s-1")},
        "usage": None,
    },
    {
        "id": "chatcmpl-s-1",
        "object": "chat.completion.chunk",
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "choices": [],
        "usage": {"prompt_tokens": 96, "completion_tokens": 1, "total_tokens": 97},
    },
]
STREAMED = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in STREAMED_CHUNKS)
STREAMED += b"data: [DONE]\n\n"
# a relayed streamed generation, as llama-server streams it (no semif: no record)
GENERATION = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hel"}}],'
    b'"created":1764756000,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1764756000,'
    b'"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"}\n\n'
    b"data: [DONE]\n\n"
)


def _base64(raw: bytes, content_type: str = "text/event-stream") -> dict:
    """An output as Data Capture stores a content type it was not told is JSON."""
    return {
        "observedContentType": content_type,
        "mode": "OUTPUT",
        "data": base64.b64encode(raw).decode(),
        "encoding": "BASE64",
    }


@pytest.mark.parametrize(
    "output",
    [
        _base64(STREAMED),
        _base64(STREAMED, "text/event-stream; charset=utf-8"),
        _base64(STREAMED, "application/octet-stream"),  # read by its first bytes, "data:"
        {"observedContentType": "text/event-stream", "data": STREAMED.decode(), "encoding": "CSV"},
    ],
)
def test_a_streamed_decision_gives_its_record(output):
    counts: Counter[str] = Counter()
    found = list(capture.read_capture([event(output, eventId="e", inferenceId="s-1")], counts))
    assert [(c.record, c.event_id, c.inference_id) for c in found] == [
        (record(decision_id="s-1"), "e", "s-1")
    ]
    assert counts == Counter(events=1, answers=1, records=1)


def test_a_relayed_streamed_generation_is_an_answer_without_a_record(tmp_path, capsys):
    """It used to be an unreadable line (exit 1): a capture file holds every answer the
    endpoint gave, generations too."""
    path = tmp_path / "c.jsonl"
    path.write_bytes(
        event(_base64(GENERATION), eventId="g") + b"\n" + event(_base64(STREAMED), eventId="e")
    )
    out = tmp_path / "records.jsonl"
    assert capture.main([str(path), "--out", str(out)]) == 0
    assert [orjson.loads(line)["decision_id"] for line in out.read_bytes().splitlines()] == ["s-1"]
    err = capsys.readouterr().err
    assert "2 events in 1 files, 1 records from 2 answers" in err
    assert "1 answers without a record" in err and "; 0 lines skipped" in err


def test_a_stream_whose_data_is_not_json_is_skipped():
    problems: list[str] = []
    line = event(_base64(b"data: {half\n\n"), eventId="e")
    assert list(capture.read_capture([line], problems=problems)) == []
    assert len(problems) == 1
    assert problems[0].startswith("line 1: the captured text/event-stream is not JSON: ")


# -- AWS's own sample -------------------------------------------------------------------


def test_awss_sample_capture_line_is_read_as_an_answer_without_a_record():
    """The reader takes AWS's own line (a CSV model's answer: no decision record in it), so a
    format error shared by this project's writer and reader cannot hide."""
    line = AWS_CAPTURE.replace("\n", "")
    assert "\n" not in line and orjson.loads(line)["eventVersion"] == "0"
    counts: Counter[str] = Counter()
    assert list(capture.read_capture([line], counts)) == []
    assert counts == Counter(events=1, answers=1, no_record=1)
    event_ = orjson.loads(line)
    assert capture.answers(event_["captureData"]["endpointOutput"]) == [0.0254181120544672]
    assert capture.body(event_["captureData"]["endpointInput"]).endswith(b",0\n")
