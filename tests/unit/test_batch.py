"""The batch command (semif_tools/batch.py): reading lines, resuming, the facts it sums up,
and a job against a small local server (retries, records, the progress bar)."""

import asyncio
import io

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from semif_tools import client
from semif_tools.batch import (
    Job,
    answer_facts,
    done_ids,
    last_records,
    read_lines,
    run,
    settled,
    summary_lines,
)


def test_lines_get_their_route_and_id(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(
        b"\n".join(
            [
                orjson.dumps({"id": "t-1", "state": "s", "questions": {"q": {"type": "noul"}}}),
                orjson.dumps(
                    {
                        "messages": [{"role": "user", "content": "hi"}],
                        "semif": {"options": ["a", "b"]},
                    }
                ),
                b"",
                b"{not json",
                b"[1, 2]",
                orjson.dumps({"input": "x"}),
                orjson.dumps({"input": "x", "questions": [{"type": "predicate"}]}),
            ]
        )
        + b"\n"
    )
    lines = list(read_lines(src))
    assert [(l.id, l.path) for l in lines] == [
        ("t-1", "/v1/systemone"),
        (2, "/v1/chat/completions"),
        (4, ""),
        (5, ""),
        (6, ""),
        (7, "/v1/decisions"),
    ]
    assert b'"id"' not in lines[0].body  # the id is the job's, not sent
    assert "line 4 is not JSON" in lines[2].error and "not a JSON object" in lines[3].error
    assert "neither a System One request" in lines[4].error


def test_resume_cuts_a_torn_last_line_and_skips_only_settled_ids(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(
        b'{"id": 1, "status": 200}\n{"id": "t-2", "status": 429}\n'
        b'{"id": 4, "status": 503}\n{"id": 4, "status": 200}\n{"id": 3, "sta'
    )
    assert done_ids(out) == {"1", "4"}  # 429 is asked again; 4's last record is a 200
    assert out.read_bytes().endswith(b"200}\n")  # the torn line is gone
    assert last_records(out)["4"]["status"] == 200
    assert done_ids(tmp_path / "missing.jsonl") == set()


@pytest.mark.parametrize(
    ("record", "final"),
    [
        ({"status": 200}, True),
        ({"status": 422}, True),
        ({"status": 400}, True),
        ({"status": 429}, False),
        ({"status": 503}, False),
        ({"status": 500}, False),
        ({"status": None, "error": {"code": "invalid_line"}}, True),
        ({"status": None, "error": {"code": "unreachable"}}, False),
        ({"status": None, "error": {"code": "timeout"}}, False),
    ],
)
def test_what_asking_again_could_not_change(record, final):
    assert settled(record) is final


def test_repeated_ids_are_refused_before_anything_is_sent(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"id": 2, "state": "s", "questions": {}}\n{"state": "s", "questions": {}}\n')
    with pytest.raises(ValueError, match="the id 2 is on more than one line"):
        asyncio.run(run(src, tmp_path / "out.jsonl", "http://127.0.0.1:9"))
    assert not (tmp_path / "out.jsonl").exists()


def test_answer_facts_per_api():
    s1 = {"answers": {"a": {"x_label_mass": 0.5, "x_route": "auto"}, "b": {"x_label_mass": 0.25}}}
    assert answer_facts("/v1/systemone", s1) == ([0.5, 0.25], ["auto"])
    chat = {"semif": {"label_mass": 0.75, "route": "review"}}
    assert answer_facts("/v1/chat/completions", chat) == ([0.75], ["review"])
    assert answer_facts("/v1/chat/completions", {"choices": []}) == ([], [])


def test_the_summary_counts_outcomes_latency_masses_and_routes():
    job = Job(4)
    job.record(
        200, 0.1, "/v1/systemone", {"answers": {"a": {"x_label_mass": 0.5, "x_route": "auto"}}}
    )
    job.record(200, 0.3, "/v1/chat/completions", {"semif": {"label_mass": 0.7}})
    job.record(422, 0.2, "/v1/systemone", None)
    job.record(None, None, "", None)
    lines = summary_lines(job)
    assert lines[0].startswith("4 lines in ") and lines[0].endswith(": error 1, ok 2, status 422 1")
    assert lines[1] == "latency p50 200 ms, p95 290 ms"
    assert lines[2] == "label mass p5 / p50 / p95: 0.510 / 0.600 / 0.690"
    assert lines[3] == "routes: auto 1"


@pytest.fixture
def waits(monkeypatch):
    """The retry policy's waits, recorded instead of slept."""
    seen: list[float] = []

    async def sleep(seconds: float) -> None:
        seen.append(seconds)

    monkeypatch.setattr(client.send_async.retry, "sleep", sleep)
    return seen


async def test_a_job_retries_what_passes_and_records_every_line(tmp_path, waits):
    asked: list[str] = []

    deadlines: set[str] = set()

    async def systemone(request: web.Request) -> web.Response:
        body = await request.json()
        asked.append(body["state"])
        deadlines.add(request.headers["X-Semif-Deadline"])
        if body["state"] == "busy" and asked.count("busy") == 1:
            return web.json_response(
                {"error": "overloaded"}, status=429, headers={"Retry-After": "3"}
            )
        if body["state"] == "broken":
            return web.json_response({"error": "bug"}, status=500)
        return web.json_response({"answers": {"q": {"x_label_mass": 0.5, "x_route": "auto"}}})

    async def props(_: web.Request) -> web.Response:
        return web.json_response({"total_slots": 2})

    app = web.Application()
    app.router.add_post("/v1/systemone", systemone)
    app.router.add_get("/props", props)
    src, out, stream = tmp_path / "in.jsonl", tmp_path / "out.jsonl", io.StringIO()
    src.write_bytes(
        b"".join(
            orjson.dumps({"id": state, "state": state, "questions": {"q": {"type": "noul"}}})
            + b"\n"
            for state in ("calm", "busy", "broken")
        )
        + b"[]\n"
    )
    async with TestServer(app) as server:
        job, complete = await run(src, out, str(server.make_url("/")), stream=stream)
    records = {r["id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    assert {k: r["status"] for k, r in records.items()} == {
        "calm": 200,
        "busy": 200,
        "broken": 500,
        4: None,
    }
    assert records[4]["error"]["code"] == "invalid_line"
    assert asked.count("busy") == 2 and asked.count("broken") == 1  # 500 is not retried
    assert waits == [3.0]  # the Retry-After, longer than the first back-off (0.5 s)
    assert deadlines == {"540"}  # 90% of the 600 s timeout: the proxy's 504 comes first
    assert not complete and job.outcomes == {"ok": 2, "status 500": 1, "error": 1}
    # not a terminal: no bar while it ran, its final state once at the end
    assert stream.getvalue().count("\n") == 1 and "4/4" in stream.getvalue()


async def test_an_unreachable_proxy_is_recorded_after_the_last_attempt(tmp_path, waits):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b'{"state": "s", "questions": {"q": {"type": "noul"}}}\n')
    job, complete = await run(src, out, "http://127.0.0.1:9", concurrency=1, stream=io.StringIO())
    record = orjson.loads(out.read_bytes())
    assert record["status"] is None and record["error"]["code"] == "unreachable"
    assert len(waits) == client.ATTEMPTS - 1 and not complete


@pytest.mark.parametrize(
    ("timeout_s", "deadline_s", "sent"),
    [(600.0, None, "540"), (100.0, None, "90"), (600.0, 3600.0, "3600"), (60.0, 12.5, "12.5")],
)
async def test_each_line_asks_the_proxy_for_a_deadline(tmp_path, timeout_s, deadline_s, sent):
    seen: list[str] = []

    async def systemone(request: web.Request) -> web.Response:
        seen.append(request.headers["X-Semif-Deadline"])
        return web.json_response({"answers": {"q": {"x_label_mass": 0.5}}})

    app = web.Application()
    app.router.add_post("/v1/systemone", systemone)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b'{"state": "s", "questions": {"q": {"type": "noul"}}}\n')
    async with TestServer(app) as server:
        await run(
            src,
            out,
            str(server.make_url("/")),
            concurrency=1,
            timeout_s=timeout_s,
            deadline_s=deadline_s,
            stream=io.StringIO(),
        )
    assert seen == [sent]
