"""The batch command's pure parts: reading lines, resuming, the facts it sums up."""

import io

import orjson
import pytest

import asyncio

from proxy.batch import Job, answer_facts, done_ids, last_records, read_lines, run, settled, summary


def test_lines_get_their_route_and_id(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join([
        orjson.dumps({"id": "t-1", "state": "s", "questions": {"q": {"type": "noul"}}}),
        orjson.dumps({"messages": [{"role": "user", "content": "hi"}], "semif": {"options": ["a", "b"]}}),
        b"",
        b"{not json",
        b"[1, 2]",
        orjson.dumps({"input": "x"}),
        orjson.dumps({"input": "x", "questions": [{"type": "predicate"}]}),
    ]) + b"\n")
    lines = list(read_lines(src))
    assert [(l.id, l.path) for l in lines] == [
        ("t-1", "/v1/systemone"), (2, "/v1/chat/completions"), (4, ""), (5, ""), (6, ""),
        (7, "/v1/decisions")]
    assert b'"id"' not in lines[0].body  # the id is the job's, not sent
    assert "line 4 is not JSON" in lines[2].error and "not a JSON object" in lines[3].error
    assert "neither a System One request" in lines[4].error


def test_resume_cuts_a_torn_last_line_and_skips_only_settled_ids(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"id": 1, "status": 200}\n{"id": "t-2", "status": 429}\n'
                    b'{"id": 4, "status": 503}\n{"id": 4, "status": 200}\n{"id": 3, "sta')
    assert done_ids(out) == {"1", "4"}  # 429 is asked again; 4's last record is a 200
    assert out.read_bytes().endswith(b'200}\n')  # the torn line is gone
    assert last_records(out)["4"]["status"] == 200
    assert done_ids(tmp_path / "missing.jsonl") == set()


@pytest.mark.parametrize(("record", "final"), [
    ({"status": 200}, True), ({"status": 422}, True), ({"status": 400}, True),
    ({"status": 429}, False), ({"status": 503}, False), ({"status": 500}, False),
    ({"status": None, "error": {"code": "invalid_line"}}, True),
    ({"status": None, "error": {"code": "unreachable"}}, False),
    ({"status": None, "error": {"code": "timeout"}}, False)])
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
    job = Job(4, io.StringIO())
    job.record(200, 0.1, "/v1/systemone", {"answers": {"a": {"x_label_mass": 0.5, "x_route": "auto"}}})
    job.record(200, 0.3, "/v1/chat/completions", {"semif": {"label_mass": 0.7}})
    job.record(422, 0.2, "/v1/systemone", None)
    job.record(None, None, "", None)
    lines = summary(job)
    assert lines[0].startswith("4 lines in ") and lines[0].endswith(
        ": error 1, ok 2, status 422 1")
    assert lines[1] == "latency p50 200 ms, p95 290 ms"
    assert lines[2] == "label mass p5 / p50 / p95: 0.510 / 0.600 / 0.690"
    assert lines[3] == "routes: auto 1"
    assert "4/4 100%" in job.stream.getvalue()


@pytest.mark.parametrize("done", [0, 3])
def test_the_bar_says_rate_and_eta(done):
    job = Job(3, io.StringIO())
    job.done = done
    bar = job.bar(job.started + 2.0)
    assert f"{done}/3" in bar and "ETA" in bar
