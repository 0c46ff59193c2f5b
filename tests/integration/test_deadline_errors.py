"""A bad deadline header is a client error naming the header, on every decision API, with
the real proxy (parsed before llama-server is asked anything)."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.test_admission_cost import ROUTE

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "semif": ROUTE}
SYSTEM_ONE = {
    "model": "jev-latest",
    "state": "a ticket",
    "questions": {"q": {"type": "choice", "criteria": {"yes": None, "no": None}}},
}


@pytest.mark.parametrize(
    ("header", "value", "message"),
    [
        (
            "X-Semif-Deadline",
            "soon",
            "X-Semif-Deadline must be a number of seconds above 0, not 'soon'",
        ),
        ("X-Semif-Deadline", "0", "X-Semif-Deadline must be a number of seconds above 0, not '0'"),
        (
            "X-Amzn-SageMaker-Custom-Attributes",
            "trace=1;semif-deadline=-3",
            "semif-deadline in X-Amzn-SageMaker-Custom-Attributes must be a number of seconds "
            "above 0, not '-3'",
        ),
        (
            "X-Stainless-Read-Timeout",
            "abc",
            "X-Stainless-Read-Timeout must be a number of seconds above 0, not 'abc'",
        ),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/invocations"])
def test_a_bad_value_is_a_400_naming_the_header(proxy_url, path, header, value, message):
    resp = httpx.post(proxy_url + path, json=CHAT, headers={header: value}, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"], error["message"]) == ("invalid_header", header, message)


def test_system_one_answers_422_at_the_header(proxy_url):
    resp = httpx.post(
        proxy_url + "/v1/systemone", json=SYSTEM_ONE, headers={"X-Semif-Deadline": "-1"}, timeout=60
    )
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"] == [
        {
            "loc": ["header", "x-semif-deadline"],
            "msg": "X-Semif-Deadline must be a number of seconds above 0, not '-1'",
            "type": "invalid_header",
        }
    ]


def test_a_bad_value_refuses_a_jsonlines_payload_whole(proxy_url):
    resp = httpx.post(
        proxy_url + "/invocations",
        content=b'{"state": "s", "questions": {"q": {"type": "noul"}}}\n',
        headers={"Content-Type": "application/jsonlines", "X-Semif-Deadline": "nan"},
        timeout=60,
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "X-Semif-Deadline"
