"""Decision records through the real proxy and llama-server: one record per decision on every
route (a chat decision, a 128-question System One request, Decisions, rerank, a jsonlines
/invocations payload), their decision ids the answers', no inputs unless asked; and records
of several kilobytes on stdout, shared with the logs, every line whole."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from scripts.stack import stop
from tests.conftest import launch_proxy

STATE = "Hello, my card was charged twice for order 1182 and the parcel is late."
CHAT = {
    "messages": [{"role": "user", "content": "Ticket: I was charged twice for one order."}],
    "semif": {"options": ["billing", "shipping", "technical"]},
}
TEAM = {"type": "choice", "criteria": ["billing", "shipping", "technical"]}


@pytest.fixture(scope="module")
def recorded(llama, logs_dir: Path) -> Iterator[tuple[str, Path]]:
    """A proxy writing its records to a file."""
    path = logs_dir / f"records-{time.monotonic_ns()}.jsonl"
    proc, url, log = launch_proxy(logs_dir, llama.url, "--decision-records", str(path))
    yield url, path
    stop(proc)
    log.close()


def _records(path: Path, ids: set[str], timeout_s: float = 20) -> dict[str, dict]:
    """The records of ``ids`` once all are in the file (written off the event loop), by
    decision id; a decision id recorded twice fails."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = path.read_bytes().splitlines() if path.exists() else []
        records = [orjson.loads(line) for line in lines]
        mine = [r for r in records if r["decision_id"] in ids]
        if {r["decision_id"] for r in mine} == ids or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    by_id = {r["decision_id"]: r for r in mine}
    assert len(by_id) == len(mine), "a decision was recorded twice"
    assert set(by_id) == ids, f"missing records: {sorted(ids - set(by_id))[:5]}"
    return by_id


def _common(record: dict, api: str) -> None:
    assert record["record"] == "semif.decision/1"
    assert record["api"] == api
    assert "input" not in record  # inputs only when asked
    assert record["prompt_hash"].startswith("hmac-sha256:") and len(record["prompt_hash"]) == 76
    assert record["prompt_tokens"] > 0 and record["latency_ms"] > 0
    assert record["read_scheme"] != "chat" and record["time"].endswith("Z")


def test_a_chat_decision_leaves_one_record_with_its_id(recorded):
    url, path = recorded
    answers = []
    for request_id in ("chat-1", "chat-2"):
        resp = httpx.post(
            url + "/v1/chat/completions",
            json=CHAT,
            headers={"X-Request-Id": request_id},
            timeout=120,
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["X-Request-Id"] == request_id
        answers.append(resp.json()["semif"])
    assert [a["decision_id"] for a in answers] == ["chat-1", "chat-2"]
    records = _records(path, {"chat-1", "chat-2"})
    one = records["chat-1"]
    _common(one, "chat")
    assert (one["request_id"], one["question_id"]) == ("chat-1", None)
    assert one["options"] == ["billing", "shipping", "technical"]
    assert one["probabilities"] == [answers[0]["probabilities"][o] for o in one["options"]]
    assert one["raw_probabilities"] == one["probabilities"]  # no profile, no debiasing
    assert one["choice"] == answers[0]["choice"]
    assert one["label_mass"] == answers[0]["label_mass"]
    assert one["model"] and one["layout"] == "conversation_first"
    # the same prompt again: the same keyed hash
    assert records["chat-2"]["prompt_hash"] == one["prompt_hash"]


def test_a_128_question_system_one_request_leaves_128_records(recorded):
    url, path = recorded
    questions = {f"q{i}": TEAM for i in range(128)}
    resp = httpx.post(
        url + "/v1/systemone",
        json={"state": STATE, "questions": questions},
        headers={"X-Request-Id": "so-128"},
        timeout=600,
    )
    assert resp.status_code == 200, resp.text
    answers = resp.json()["answers"]
    assert {qid: a["x_decision_id"] for qid, a in answers.items()} == {
        qid: f"so-128/{qid}" for qid in questions
    }
    records = _records(path, {f"so-128/{qid}" for qid in questions})
    for qid, answer in answers.items():
        record = records[f"so-128/{qid}"]
        _common(record, "system_one")
        assert (record["request_id"], record["question_id"]) == ("so-128", qid)
        assert record["probabilities"] == [answer["probabilities"][o] for o in record["options"]]
        assert record["confidence"] == answer["confidence"]


def test_decisions_and_rerank_leave_one_record_per_decision(recorded):
    url, path = recorded
    resp = httpx.post(
        url + "/v1/decisions",
        json={
            "model": "gpt-6-luna",
            "input": STATE,
            "questions": [
                {"type": "predicate", "instructions": "Does the customer want a refund?"},
                {
                    "type": "choice",
                    "instructions": "Which team?",
                    "choices": [{"value": "billing"}, {"value": "shipping"}],
                },
            ],
        },
        headers={"X-Request-Id": "dec-1"},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    assert [a["x_decision_id"] for a in resp.json()["answers"]] == ["dec-1/0", "dec-1/1"]
    resp = httpx.post(
        url + "/v1/rerank",
        json={"query": "charged twice", "documents": ["refunds", "parcels", "passwords"]},
        headers={"X-Request-Id": "rr-1"},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    ranked = {r["index"]: r["x_decision_id"] for r in resp.json()["results"]}
    assert ranked == {0: "rr-1/0", 1: "rr-1/1", 2: "rr-1/2"}
    records = _records(path, {"dec-1/0", "dec-1/1", "rr-1/0", "rr-1/1", "rr-1/2"})
    _common(records["dec-1/0"], "decisions")
    assert records["dec-1/0"]["question_type"] == "noul"
    assert records["dec-1/1"]["options"] == ["billing", "shipping"]
    for i in range(3):
        _common(records[f"rr-1/{i}"], "rerank")
        assert records[f"rr-1/{i}"]["question_id"] == str(i)


def test_a_jsonlines_payload_leaves_a_record_per_decision_of_every_line(recorded):
    url, path = recorded
    lines = [
        CHAT,
        {"state": STATE, "questions": {"a": TEAM, "b": {"type": "noul"}}},
        {
            "model": "gpt-6-luna",
            "input": STATE,
            "questions": [{"type": "predicate", "instructions": "Refund?"}],
        },
    ]
    resp = httpx.post(
        url + "/invocations",
        content=b"\n".join(orjson.dumps(line) for line in lines) + b"\n",
        headers={"Content-Type": "application/jsonlines", "X-Request-Id": "jl-1"},
        timeout=300,
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["X-Request-Id"] == "jl-1"
    chat, system_one, decisions = (orjson.loads(line) for line in resp.content.splitlines())
    assert chat["semif"]["decision_id"] == "jl-1/0"
    assert {q: a["x_decision_id"] for q, a in system_one["answers"].items()} == {
        "a": "jl-1/1/a",
        "b": "jl-1/1/b",
    }
    assert decisions["answers"][0]["x_decision_id"] == "jl-1/2"
    records = _records(path, {"jl-1/0", "jl-1/1/a", "jl-1/1/b", "jl-1/2"})
    for record in records.values():
        _common(record, "invocations")
    assert records["jl-1/0"]["question_id"] is None
    assert records["jl-1/1/b"]["question_id"] == "b"


# -- stdout ---------------------------------------------------------------------------

# 20 options of 250 characters: a record of about 6 KB from a short list of labels
_OPTIONS = [f"{i:02d} " + "a long option name that makes the record large " * 5 for i in range(20)]


@pytest.fixture(scope="module")
def records_stdout(llama, logs_dir: Path) -> Iterator[tuple[str, Path]]:
    """A proxy writing records to stdout (the log file here, shared with the logs)."""
    proc, url, log = launch_proxy(logs_dir, llama.url, "--decision-records", "stdout")
    yield url, Path(log.name)
    stop(proc)
    log.close()


def test_records_of_several_kilobytes_on_stdout_are_whole(records_stdout):
    url, log = records_stdout

    def ask(n: int) -> str:
        with httpx.Client(timeout=300) as client:  # a connection each, at once
            resp = client.post(
                url + "/v1/systemone",
                json={
                    "state": STATE,
                    "questions": {"team": {"type": "choice", "criteria": _OPTIONS}},
                },
                # a deadline as long as the client waits: this is about the lines, not
                # admission, which a loaded machine's costs would otherwise refuse
                headers={"X-Request-Id": f"w-{n}", "X-Semif-Deadline": "300"},
            )
        assert resp.status_code == 200, resp.text
        return resp.json()["answers"]["team"]["x_decision_id"]

    ask(0)  # the prompt computed once before the rest come at once
    with ThreadPoolExecutor(3) as pool:
        ids = {"w-0", *pool.map(ask, range(1, 7))}
    assert ids == {f"w-{n}" for n in range(7)}
    deadline = time.monotonic() + 20
    while True:
        lines = [line for line in log.read_bytes().splitlines() if b"semif.decision/1" in line]
        if len(lines) >= 7 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    records = [orjson.loads(line) for line in lines]  # a torn line would not parse
    assert sorted(r["decision_id"] for r in records) == sorted(ids)
    assert all(len(line) > 4096 for line in lines)  # more than a pipe keeps whole
    assert all(r["options"] == _OPTIONS for r in records)
