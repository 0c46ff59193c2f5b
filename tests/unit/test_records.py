"""Decision records (proxy/recorder.py, proxy/record_sink.py): ids, the record's exact
fields, the keyed hash, inputs only when asked, and a sink that stalls (answers go on, the
queue stays bounded, drops are counted), and records larger than a pipe keeps whole that
never tear on stdout."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.calibration.profile import KindCalibration, Profile, Threshold
from proxy.config import Settings, load_settings
from proxy.decision.debias import divide_out
from proxy.decision.outcome import Outcome
from proxy.decision.question import choice_question, noul_question, score_question
from proxy.decision.readout import Decision, decide
from proxy.facts import Facts
from proxy.metrics import Metrics
from proxy.profile_store import DebiasPlan, ProfileStore, apply_profile
from proxy.protocol.records import DecisionRecord
from proxy.record_sink import RecordWriter, sink_writer
from proxy.recorder import (
    ANSWER,
    OFF,
    Context,
    Recorder,
    decision_ids,
    escape_id,
    open_recorder,
    prompt_hash,
    record_key,
    records_of,
    request_id,
)
from proxy.service import Answered, Asked, DecisionService
from semif_tools.record_files import load_records
from tests.conftest import free_port
from tests.standin import StandIn
from tests.unit.test_service import RecordedUpstream

KEY = b"k" * 16
# HMAC-SHA256(KEY, 1, 2, 3 as 4-byte little-endian), computed once with Python's hmac
HASH_123 = "hmac-sha256:69775fbf37b0ba1ad3c48043820613d8953167d2adad8f76f84113830fdb7ac7"


def _sample(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# -- ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_id_", "qids", "line", "expected"),
    [
        ("r1", ["0"], None, {"0": "r1"}),  # one decision: the request id alone
        ("r1", ["billing"], None, {"billing": "r1"}),
        ("r1", ["a", "b"], None, {"a": "r1/a", "b": "r1/b"}),
        ("r1", ["0"], 3, {"0": "r1/3"}),  # a jsonlines line holding one decision
        ("r1", ["0", "1"], 0, {"0": "r1/0/0", "1": "r1/0/1"}),
        ("r1", [str(i) for i in range(3)], None, {"0": "r1/0", "1": "r1/1", "2": "r1/2"}),
        # an InferenceId holding "/" or "%" enters a decision id percent-encoded: the first
        # "/" of a decision id always ends its request part
        ("a/b", ["0"], None, {"0": "a%2Fb"}),
        ("a/b", ["x", "y"], None, {"x": "a%2Fb/x", "y": "a%2Fb/y"}),
        ("50% off/2", ["0"], 1, {"0": "50%25 off%2F2/1"}),
        ("t #1+2@x", ["0"], None, {"0": "t #1+2@x"}),  # other characters as they are
    ],
)
def test_decision_ids(request_id_, qids, line, expected):
    assert decision_ids(request_id_, qids, line) == expected


@pytest.mark.parametrize(
    ("request_id_", "escaped"),
    [("abc-123_x.y:z", "abc-123_x.y:z"), ("a/b", "a%2Fb"), ("%2F", "%252F"), ("/%/", "%2F%25%2F")],
)
def test_escape_id_is_percent_encoding_of_percent_and_slash(request_id_, escaped):
    assert escape_id(request_id_) == escaped
    assert "/" not in escaped and escaped.replace("%2F", "/").replace("%25", "%") == request_id_


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Request-Id": "abc-123_x.y:z"}, "abc-123_x.y:z"),
        ({"X-Request-Id": "a" * 128}, "a" * 128),
        ({"X-Amzn-SageMaker-Inference-Id": "inf-1", "X-Request-Id": "r"}, "inf-1"),
        # an InferenceId is kept whenever AWS accepts it: 1 to 64 printable ASCII characters,
        # the first not a space (spaces, "/", "@", "#", "+" included)
        (
            {"X-Amzn-SageMaker-Inference-Id": "ticket 7/a@b#c+d", "X-Request-Id": "r"},
            "ticket 7/a@b#c+d",
        ),
        ({"X-Amzn-SageMaker-Inference-Id": "~" * 64}, "~" * 64),
        ({"X-Amzn-SageMaker-Inference-Id": "x" * 65, "X-Request-Id": "r"}, "r"),  # too long
        ({"X-Amzn-SageMaker-Inference-Id": " lead", "X-Request-Id": "r"}, "r"),
        ({"X-Amzn-SageMaker-Inference-Id": "tab\there", "X-Request-Id": "r"}, "r"),
        ({"X-Amzn-SageMaker-Inference-Id": "caf\u00e9", "X-Request-Id": "r"}, "r"),  # not ASCII
        ({"X-Amzn-SageMaker-Inference-Id": ""}, None),
        ({"X-Request-Id": "a" * 129}, None),  # too long
        ({"X-Request-Id": "a/b"}, None),  # a slash would make decision ids ambiguous
        ({"X-Request-Id": ""}, None),
        ({"X-Request-Id": "with space"}, None),
        ({}, None),
    ],
)
def test_request_id_is_the_clients_when_valid_else_a_new_uuid(headers, expected):
    got = request_id(headers)
    if expected is None:
        assert len(got) == 32 and int(got, 16) >= 0
        assert request_id(headers) != got  # new each time
    else:
        assert got == expected


@pytest.mark.parametrize(
    ("headers", "replaced"),
    [
        ({"X-Amzn-SageMaker-Inference-Id": "ok id/1"}, {"inference_id": 0, "request_id": 0}),
        ({"X-Amzn-SageMaker-Inference-Id": "x" * 65}, {"inference_id": 1, "request_id": 0}),
        (
            {"X-Amzn-SageMaker-Inference-Id": " x", "X-Request-Id": "a b"},
            {"inference_id": 1, "request_id": 1},
        ),
        (
            {"X-Amzn-SageMaker-Inference-Id": "", "X-Request-Id": "r"},
            {"inference_id": 1, "request_id": 0},
        ),
        ({"X-Request-Id": "a/b"}, {"inference_id": 0, "request_id": 1}),
        ({}, {"inference_id": 0, "request_id": 0}),  # none given: a new id, nothing replaced
    ],
)
def test_a_refused_id_header_is_counted_by_header(headers, replaced):
    metrics = Metrics()
    request_id(headers, metrics)
    assert {
        header: _sample(metrics, "semif_request_ids_replaced_total", {"header": header})
        for header in replaced
    } == replaced


# -- the hash -------------------------------------------------------------------------


def test_prompt_hash_is_hmac_sha256_of_the_ids_as_4_byte_little_endian():
    assert prompt_hash(KEY, [1, 2, 3]) == HASH_123
    ids = [2, 198, 49, 70000, 0]
    packed = struct.pack("<5I", *ids)
    assert prompt_hash(KEY, ids) == (
        "hmac-sha256:" + hmac.new(KEY, packed, hashlib.sha256).hexdigest()
    )


def test_prompt_hash_is_keyed():
    ids = [2, 198, 49]
    assert prompt_hash(KEY, ids) == prompt_hash(KEY, tuple(ids))
    assert prompt_hash(KEY, ids) != prompt_hash(b"j" * 16, ids)
    assert prompt_hash(KEY, ids) != hashlib.sha256(struct.pack("<3I", *ids)).hexdigest()
    assert prompt_hash(KEY, ()) is None  # read through the chat endpoint: no ids


def test_a_key_file_is_read_and_a_short_one_refused(tmp_path):
    path = tmp_path / "key"
    path.write_bytes(b"0123456789abcdef0123\n")
    assert record_key(Settings(decision_records_key_file=str(path))) == b"0123456789abcdef0123"
    path.write_bytes(b"short\n")
    with pytest.raises(ValueError, match="at least 16"):
        record_key(Settings(decision_records_key_file=str(path)))
    one, two = record_key(Settings()), record_key(Settings())
    assert len(one) == 32 and one != two  # random per start


# -- the record -------------------------------------------------------------------------

CHOICE = choice_question(["billing", "shipping"])
SCORE = score_question(["low", "mid", "high"])
NOUL = noul_question(None)


def _outcome(question, probs, best, **extra) -> Outcome:
    return Outcome(
        Decision(question, probs, 0.5, best),
        ("A", "B", "C")[: len(probs)],
        "smollm2.gguf",
        12,
        10,
        1,
        **extra,
    )


CALIBRATED = {
    "calibration": {"profile": "p", "method": "temperature"},
    "route": "auto",
    "route_reason": "above_threshold",
    "debias": "cyclic",
    "read_scheme": "segment",
    "repeatable": True,
    "prompt_ids": (1, 2, 3),
}
CONTEXT = Context("r1", "system_one", arrived=100.0, state="the ticket")
ASKED = Asked.about_state("the ticket", {"a": CHOICE, "b": SCORE, "c": NOUL})
OUTCOMES = {
    "a": _outcome(CHOICE, (0.25, 0.75), 1, **CALIBRATED),
    "b": _outcome(SCORE, (0.25, 0.5, 0.25), 1, layout="options_first"),
    "c": _outcome(NOUL, (0.875, 0.125), 0),
}
RAW = {"a": (0.375, 0.625), "b": (0.25, 0.5, 0.25), "c": (0.875, 0.125)}
IDS = decision_ids("r1", list(OUTCOMES))


def _records(**kw):
    args = {
        "threshold": 0.625,
        "llama_build": "b11434",
        "answered_at": 1796292672.345678,  # 2026-12-03T10:11:12.345678Z
        "finished": 100.0125,
        "key": KEY,
    }
    args.update(kw)
    made = records_of(CONTEXT, ASKED, OUTCOMES, RAW, IDS, **args)
    return {qid: record.dump() for qid, record in made.items()}


def test_the_record_holds_exactly_the_documented_fields():
    records = _records()
    assert records["a"] == {
        "record": "semif.decision/1",
        "decision_id": "r1/a",
        "request_id": "r1",
        "question_id": "a",
        "time": "2026-12-03T10:11:12.345Z",
        "api": "system_one",
        "model": "smollm2.gguf",
        "llama_build": "b11434",
        "prompt_format_version": "semif-1",
        "layout": "conversation_first",
        "read_scheme": "segment",
        "prompt_tokens": 12,
        "prompt_hash": HASH_123,
        "question_type": "choice",
        "options": ["billing", "shipping"],
        "raw_probabilities": [0.375, 0.625],
        "probabilities": [0.25, 0.75],
        "choice": "shipping",
        "confidence": 0.5,  # (2 * 0.75 - 1) / (2 - 1)
        "label_mass": 0.5,
        "profile": "p",
        "calibration_method": "temperature",
        "threshold": 0.625,
        "route": "auto",
        "route_reason": "above_threshold",
        "debias": "cyclic",
        "repeatable": True,
        "latency_ms": pytest.approx(12.5, abs=1e-9),  # 100.0125 - 100.0 seconds
    }
    # no profile applied: no threshold, whatever the argument; no ids: no hash
    assert records["b"]["threshold"] is None and records["b"]["profile"] is None
    assert records["b"]["prompt_hash"] is None
    assert records["b"]["prompt_format_version"] == "semif-3"
    assert records["b"]["layout"] == "options_first"
    # a score: its confidence is score_confidence, its choice the likeliest level's name
    # spread D = (1 + 0 + 1) / 3; deviation = 0.25 * 1 + 0.25 * 1 = 0.5; 1 - 0.5 / (2/3)
    assert records["b"]["confidence"] == pytest.approx(0.25, abs=1e-15)
    assert (records["b"]["choice"], records["b"]["question_type"]) == ("1", "score")
    # yes/no: 2 * 0.875 - 1
    assert (records["c"]["confidence"], records["c"]["choice"]) == (0.75, "true")
    assert records["c"]["question_type"] == "noul"
    assert records["c"]["options"] == ["true", "false"]
    assert [r["decision_id"] for r in records.values()] == ["r1/a", "r1/b", "r1/c"]


def test_floats_are_written_as_the_shortest_repr_that_round_trips():
    third = 1 / 3
    outcomes = {"a": _outcome(CHOICE, (third, 1 - third), 1)}
    record = records_of(
        CONTEXT,
        ASKED,
        outcomes,
        {"a": (third, 1 - third)},
        {"a": "r1"},
        threshold=None,
        llama_build="",
        answered_at=0.0,
        finished=100.0,
        key=KEY,
    )["a"].dump()
    line = orjson.dumps(record)
    assert b'"raw_probabilities":[0.3333333333333333,0.6666666666666667]' in line
    assert orjson.loads(line)["probabilities"] == [third, 1 - third]
    assert record["time"] == "1970-01-01T00:00:00.000Z"
    assert record["llama_build"] is None  # not told


def test_inputs_are_absent_unless_asked():
    assert all("input" not in r for r in _records().values())
    with_inputs = _records(inputs=True)
    assert with_inputs["a"]["input"] == {
        "state": "the ticket",
        "question": {"type": "choice", "instructions": None, "options": ["billing", "shipping"]},
    }
    chat = Context("r2", "chat", arrived=100.0, question_ids=False)
    messages = [{"role": "user", "content": "where is my parcel?"}]
    asked = Asked(messages, {"0": CHOICE})
    record = records_of(
        chat,
        asked,
        {"0": OUTCOMES["a"]},
        {"0": RAW["a"]},
        {"0": "r2"},
        threshold=None,
        llama_build="b1",
        answered_at=0.0,
        finished=100.0,
        key=KEY,
        inputs=True,
    )["0"].dump()
    assert record["input"] == {"messages": messages}
    assert record["question_id"] is None and record["decision_id"] == "r2"


async def test_records_from_the_service_carry_the_raw_and_the_calibrated_probabilities(tmp_path):
    """Recorded reads through the real pipeline, with a temperature profile and a PriDe
    prior: the record's raw probabilities are the debiased read, its probabilities the
    calibrated ones, exactly as apply_profile makes them in one step."""
    profile = Profile(
        name="p",
        model="smollm2",
        prompt_format_version="semif-1",
        created="x",
        data_sha256="0" * 64,
        calibration={"choice": KindCalibration("temperature", {"temperature": 2.0})},
        threshold=Threshold(0.95, 0.6, 0.5),
        debias="pride",
        position_prior={"choice": {2: (0.8, 0.2)}},
    )
    (tmp_path / "p.json").write_bytes(orjson.dumps(profile.to_json()))
    logprobs = [math.log(0.5), math.log(0.125)]
    up = RecordedUpstream([{49: logprobs[0], 51: logprobs[1]}])
    service = DecisionService(up, n_probs=8, profiles=ProfileStore(tmp_path, "p"))
    asked = Asked.about_state("ticket", {"q": CHOICE})
    answered = await service.answer(asked, Facts())
    read = decide(CHOICE, logprobs)
    debiased = divide_out(read, (0.8, 0.2))
    assert answered.raw == {"q": debiased.probabilities}
    assert answered.profile == profile
    outcome = answered["q"]
    one_step = apply_profile(
        profile, replace(outcome, decision=read), DebiasPlan("pride", prior=(0.8, 0.2))
    )
    assert outcome.decision.probabilities == one_step.decision.probabilities
    assert (outcome.route, outcome.debias) == (one_step.route, "pride")
    sent = up.requests[-1][1]  # the tokens of the read
    assert outcome.prompt_ids == tuple(sent)
    recorder = Recorder(ANSWER, key=KEY)
    context = Context("r9", "system_one", arrived=time.perf_counter(), state="ticket")
    decided = recorder.decided(context, asked, answered, "b11434")
    assert decided.ids == {"q": "r9"}
    record = decided.records["q"]
    assert record["raw_probabilities"] == list(debiased.probabilities)
    assert record["probabilities"] == list(one_step.decision.probabilities)
    assert record["prompt_hash"] == prompt_hash(KEY, sent)
    assert record["prompt_tokens"] == len(sent)
    assert (record["threshold"], record["profile"], record["debias"]) == (0.6, "p", "pride")
    assert record["calibration_method"] == "temperature"


def test_records_off_still_give_decision_ids():
    answered = Answered()
    answered.update(OUTCOMES)
    answered.raw.update(RAW)
    decided = Recorder(OFF).decided(CONTEXT, ASKED, answered, "b1")
    assert decided.ids == IDS and decided.records is None


# -- the sink -------------------------------------------------------------------------


class Stalled:
    """A sink whose write blocks until released (stdout nobody reads)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.data: list[bytes] = []

    def __call__(self, data: bytes) -> None:
        self.entered.set()
        self.release.wait(30)
        self.data.append(data)


def test_a_stalled_sink_bounds_the_queue_and_counts_the_drops():
    metrics, sink = Metrics(), Stalled()
    writer = RecordWriter(sink, 3, metrics)
    assert writer.put({"n": 0})
    assert sink.entered.wait(5)  # the thread holds record 0 in a write that does not return
    started = time.perf_counter()
    taken = [writer.put({"n": n}) for n in range(1, 10)]
    assert time.perf_counter() - started < 0.5  # put never waits for the sink
    assert taken == [True, True, True] + [False] * 6
    assert writer.queued == 3
    assert _sample(metrics, "semif_decision_records_dropped_total") == 6
    assert _sample(metrics, "semif_decision_records_written_total") == 0
    sink.release.set()
    writer.close(5)
    lines = b"".join(sink.data).splitlines()
    assert [orjson.loads(line)["n"] for line in lines] == [0, 1, 2, 3]
    assert _sample(metrics, "semif_decision_records_written_total") == 4


def test_a_failing_sink_drops_counted_and_logged(caplog):
    metrics = Metrics()

    def broken(data: bytes) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    writer = RecordWriter(broken, 10, metrics)
    writer.put({"n": 1})
    writer.close(5)
    assert _sample(metrics, "semif_decision_records_dropped_total") == 1
    assert "dropped (writing failed" in caplog.text


def test_a_file_sink_appends_whole_lines(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"earlier":1}\n')
    recorder = open_recorder(Settings(decision_records=str(path)), Metrics(), key=KEY)
    answered = Answered()
    answered.update(OUTCOMES)
    answered.raw.update(RAW)
    decided = recorder.decided(CONTEXT, ASKED, answered, "b1")
    recorder.close()
    lines = path.read_bytes().splitlines()
    assert decided.records is None
    assert orjson.loads(lines[0]) == {"earlier": 1}
    assert [orjson.loads(line)["decision_id"] for line in lines[1:]] == ["r1/a", "r1/b", "r1/c"]


CHAT = {
    "messages": [{"role": "user", "content": "Ticket: where is my parcel?"}],
    "semif": {"options": ["billing", "shipping"]},
}


async def test_decisions_are_answered_while_the_sink_stalls():
    sink = Stalled()
    settings_ = {"decision_records": "stdout", "decision_records_buffer": 2}
    with StandIn(tokens=True) as standin:
        settings = Settings(upstream_url=standin.url, **settings_)
        app = create_app(settings, records_to=sink, records_key=KEY)
        async with TestClient(TestServer(app)) as client:
            ids = []
            for n in range(8):
                resp = await client.post(
                    "/v1/chat/completions", json=CHAT, headers={"X-Request-Id": f"req-{n}"}
                )
                assert resp.status == 200, await resp.text()
                if n == 0:  # the writer thread holds record 0 in a write that does not return
                    assert await asyncio.to_thread(sink.entered.wait, 5)
                body = await resp.json()
                assert resp.headers["X-Request-Id"] == f"req-{n}"
                ids.append(body["semif"]["decision_id"])
                assert "record" not in body["semif"]
            assert ids == [f"req-{n}" for n in range(8)]
            metrics = await (await client.get("/metrics")).text()
            # one record in the stalled write, two queued, five dropped
            assert "semif_decision_records_dropped_total 5.0" in metrics
            assert "semif_decision_records_written_total 0.0" in metrics
            sink.release.set()
    lines = b"".join(sink.data).splitlines()
    assert [orjson.loads(line)["decision_id"] for line in lines] == ["req-0", "req-1", "req-2"]


async def test_records_ride_in_the_answers_with_answer():
    with StandIn(tokens=True) as standin:
        settings = Settings(upstream_url=standin.url, decision_records="answer")
        async with TestClient(TestServer(create_app(settings, records_key=KEY))) as client:
            resp = await client.post("/v1/chat/completions", json=CHAT)
            body = await resp.json()
            semif = body["semif"]
            assert semif["record"]["decision_id"] == semif["decision_id"]
            assert semif["decision_id"] == resp.headers["X-Request-Id"]
            assert len(semif["decision_id"]) == 32  # none given: a uuid4
            assert semif["record"]["probabilities"] == [
                semif["probabilities"][o] for o in semif["record"]["options"]
            ]
            assert "input" not in semif["record"]
            state = {
                "state": "a parcel",
                "questions": {"team": {"type": "choice", "criteria": ["billing", "shipping"]}},
            }
            resp = await client.post("/v1/systemone", json=state, headers={"X-Request-Id": "s-1"})
            answer = (await resp.json())["answers"]["team"]
            assert answer["x_decision_id"] == "s-1"  # one question: the request id
            assert answer["x_record"]["question_id"] == "team"
            assert answer["x_record"]["api"] == "system_one"


# -- stdout ---------------------------------------------------------------------------

_LONG = [f"{i:02d} " + "a long option name that makes the record large " * 5 for i in range(20)]


def test_records_of_several_kilobytes_come_out_of_stdout_whole(tmp_path):
    """``python -m proxy --decision-records stdout`` before the stand-in, stdout a pipe
    (which keeps only writes of up to 4096 bytes whole): 5 KB records of requests on four
    connections at once come out one whole record a line."""
    with StandIn(tokens=True) as standin:
        port = free_port()
        with open(tmp_path / "log", "wb") as log:
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "proxy", "--port", str(port)),
                    *("--upstream-url", standin.url),
                    *("--decision-records", "stdout"),
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                env={k: v for k, v in os.environ.items() if not k.startswith("PROXY_")},
            )
        out = bytearray()
        reader = threading.Thread(target=lambda: out.extend(proc.stdout.read()))
        reader.start()
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/livez", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, (
                    tmp_path / "log"
                ).read_text()
                time.sleep(0.1)

            def ask(n: int) -> str:
                with httpx.Client(timeout=60) as client:  # its own connection
                    resp = client.post(
                        url + "/v1/systemone",
                        json={
                            "state": "a parcel",
                            "questions": {"team": {"type": "choice", "criteria": _LONG}},
                        },
                        headers={"X-Request-Id": f"w-{n}"},
                    )
                assert resp.status_code == 200, resp.text
                return resp.json()["answers"]["team"]["x_decision_id"]

            with ThreadPoolExecutor(4) as pool:
                ids = sorted(pool.map(ask, range(12)))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            reader.join(10)
            proc.stdout.close()
    lines = bytes(out).splitlines()
    records = [orjson.loads(line) for line in lines]  # a torn line would not parse
    assert sorted(r["decision_id"] for r in records) == ids == sorted(f"w-{n}" for n in range(12))
    assert all(len(line) > 4096 for line in lines)
    assert all(r["options"] == _LONG for r in records)
    # one key for the run: the same prompt, the same hash
    assert len({r["prompt_hash"] for r in records}) == 1


# -- settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, False),
        (["--decision-records-inputs"], {}, True),
        (["--no-decision-records-inputs"], {"PROXY_DECISION_RECORDS_INPUTS": "true"}, False),
        ([], {"PROXY_DECISION_RECORDS_INPUTS": "true"}, True),
        ([], {"PROXY_DECISION_RECORDS_INPUTS": "1"}, True),
        ([], {"PROXY_DECISION_RECORDS_INPUTS": "off"}, False),
    ],
)
def test_the_inputs_setting_is_a_boolean(argv, env, expected):
    assert load_settings(argv, env).decision_records_inputs is expected


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        ([], {"PROXY_DECISION_RECORDS_INPUTS": "maybe"}),
        (["--decision-records-buffer", "0"], {}),
        (["--decision-records", " "], {}),
        # words that mean "off" or "on" elsewhere must not quietly name a file here
        (["--decision-records", "Off"], {}),
        ([], {"PROXY_DECISION_RECORDS": "none"}),
        ([], {"PROXY_DECISION_RECORDS": "false"}),
        (["--decision-records", "STDOUT"], {}),
        (["--decision-records", "stdout "], {}),
        (["--decision-records", "records.jsonl"], {}),
    ],
)
def test_impossible_record_settings_are_refused(argv, env):
    with pytest.raises(ValueError):
        load_settings(argv, env)


def test_a_file_is_named_by_a_path():
    assert load_settings(["--decision-records", "./r.jsonl"], {}).decision_records == "./r.jsonl"


def test_the_queue_is_bounded_in_bytes_too():
    metrics = Metrics()
    writing = threading.Event()
    release = threading.Event()
    written: list[bytes] = []

    def stalled(data: bytes) -> None:
        writing.set()
        release.wait(10)
        written.append(data)

    big = {"input": "x" * 1000}  # 1,013 bytes as a JSON line
    writer = RecordWriter(stalled, 1000, metrics, max_bytes=3 * 1013)
    assert writer.put(big) is True
    assert writing.wait(10)  # the writer thread took it and is stalled in its write
    results = [writer.put(big) for _ in range(5)]
    assert results == [True, True, True, False, False]  # three more fit the bytes
    assert _sample(metrics, "semif_decision_records_dropped_total") == 2
    assert writer.put({"bad": {1, 2}}) is False  # not JSON: dropped alone
    release.set()
    writer.close()
    assert b"".join(written).count(b"\n") == 4
    assert writer.put(big) is False  # after close: counted, not lost silently


def test_the_record_settings_come_from_flags_and_environment():
    settings = load_settings(
        ["--decision-records", "stdout"],
        {"PROXY_DECISION_RECORDS_BUFFER": "50", "PROXY_DECISION_RECORDS_KEY_FILE": "/k"},
    )
    assert (settings.decision_records, settings.decision_records_buffer) == ("stdout", 50)
    assert settings.decision_records_key_file == "/k"
    assert Settings().decision_records == "off"


def test_a_record_that_cannot_be_made_drops_it_counted_not_the_decision(caplog):
    metrics = Metrics()
    answered = Answered()
    answered.update(OUTCOMES)  # no raw probabilities: records_of fails on them
    decided = Recorder(ANSWER, key=KEY, metrics=metrics).decided(CONTEXT, ASKED, answered, "b1")
    assert decided == type(decided)(IDS)
    assert _sample(metrics, "semif_decision_records_dropped_total") == 3
    assert "could not be made" in caplog.text


@pytest.mark.parametrize("inputs", [False, True])
def test_the_records_made_are_valid_decision_records(inputs):
    """``records_of`` builds with ``model_construct`` (its values are the proxy's own): what
    it makes still validates against the model, and validating it changes nothing."""
    for record in _records(inputs=inputs).values():
        assert DecisionRecord.model_validate(record).dump() == record


@pytest.mark.parametrize("inputs", [False, True])
def test_the_tools_read_what_the_proxy_writes_through_one_model(tmp_path, inputs):
    """A record file written by the proxy's recorder (records_of, the sink's writer) is read
    back by semif_tools through the same ``DecisionRecord``: every field as written."""
    path = tmp_path / "records.jsonl"
    write, on_close = sink_writer(str(path))
    recorder = Recorder(
        "file", key=KEY, inputs=inputs, writer=RecordWriter(write, 16, on_close=on_close)
    )
    answered = Answered()
    answered.update(OUTCOMES)
    answered.raw.update(RAW)
    recorder.decided(CONTEXT, ASKED, answered, "b11434")
    recorder.close()
    lines = path.read_bytes().splitlines()
    read = load_records([path]).records
    assert [r.decision_id for r in read] == ["r1/a", "r1/b", "r1/c"]
    for line, record in zip(lines, read, strict=True):
        assert record.fields == orjson.loads(line)
        model = DecisionRecord.model_validate_json(line)
        assert orjson.dumps(model.dump()) == line  # the model gives back the bytes written
        assert record.options == tuple(model.options)
        assert record.raw_probabilities == tuple(model.raw_probabilities)
        assert ("input" in record.fields) is inputs
