"""SageMaker Batch Transform's call: /invocations with application/jsonlines, answered
line for line in order, a failed line answering an error record."""

import json

import httpx
import pytest

S1 = {"state": "My parcel never arrived.", "questions": {"late": {"type": "noul"}}}
DECISIONS = {
    "model": "gpt-6-luna",
    "input": "My parcel never arrived.",
    "questions": [{"type": "predicate", "instructions": "Is the parcel late?"}],
}
CHAT = {
    "messages": [{"role": "user", "content": "Ticket: charged twice"}],
    "semif": {"options": ["billing", "shipping"]},
}
HEADERS = {"Content-Type": "application/jsonlines"}


def test_every_line_is_answered_in_order(proxy_url):
    lines = [
        json.dumps(S1),
        json.dumps(DECISIONS),
        json.dumps(CHAT),
        "{broken",
        json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        json.dumps({**S1, "questions": {"q": {"type": "choice", "criteria": ["one"]}}}),
        "",
    ]  # a blank line is answered too: as many answers as lines
    resp = httpx.post(
        proxy_url + "/invocations", content="\n".join(lines) + "\n", headers=HEADERS, timeout=300
    )
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith(
        "application/jsonlines"
    )
    answers = [json.loads(x) for x in resp.text.splitlines()]
    assert len(answers) == len(lines)
    # the same bodies asked one by one give the same answers (reads are repeatable)
    direct = httpx.post(proxy_url + "/v1/systemone", json=S1, timeout=120).json()
    assert answers[0]["answers"]["late"]["noul"] == pytest.approx(
        direct["answers"]["late"]["noul"], rel=1e-12
    )
    assert answers[1]["answers"][0]["type"] == "predicate"
    assert answers[2]["semif"]["choice"] in ("billing", "shipping")
    assert answers[3]["error"]["status"] == 400 and answers[3]["error"]["code"] == "invalid_json"
    assert answers[4]["error"]["param"] == "semif"
    assert answers[5]["error"]["status"] == 422 and answers[5]["error"]["detail"]
    assert answers[6]["error"]["code"] == "blank_line"


def test_execution_parameters_advertise_multi_record_payloads(proxy_url):
    params = httpx.get(proxy_url + "/execution-parameters").json()
    assert params == {
        "MaxConcurrentTransforms": 1,
        "BatchStrategy": "MULTI_RECORD",
        "MaxPayloadInMB": 1,
    }


def test_a_payload_over_the_limit_is_a_413(proxy_url):
    line = json.dumps({**S1, "state": "x" * 1000}) + "\n"
    body = line * (7 * 1024 * 1024 // len(line))
    resp = httpx.post(proxy_url + "/invocations", content=body, headers=HEADERS, timeout=60)
    assert resp.status_code == 413
