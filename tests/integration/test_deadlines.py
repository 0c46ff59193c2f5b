"""A request's own deadline (proxy/deadlines.py) with the real llama-server and proxy: a
header lengthens or shortens the deadline that admission refuses by at once, through the
OpenAI SDK's timeout, our header and SageMaker's custom attributes on /invocations."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.integration.test_admission_cost import ROUTE, _long, _settled, _settled_proxy

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def one_second(llama, logs_dir) -> Iterator[str]:
    """A proxy whose own deadline is 1 s: no read of a long conversation fits it."""
    yield from _settled_proxy(llama, logs_dir, "--decision-deadline-s", "1")


def _chat(n: int, sentences: int) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": _long(n, sentences)}],
        "semif": ROUTE,
    }


def test_our_header_lengthens_the_deadline_a_long_conversation_is_refused_by(one_second):
    body = _chat(11, 40)  # about 1,400 tokens: seconds on a CPU, never 1 s
    started = time.monotonic()
    resp = httpx.post(one_second + CHAT, json=body, timeout=120)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "exceeds_deadline"
    assert (
        "the deadline is 1 s: send a shorter conversation or fewer options, or send a "
        "longer X-Semif-Deadline (at most 3600 s)" in error["message"]
    )
    assert time.monotonic() - started < 1  # at once, by the estimate
    resp = httpx.post(
        one_second + CHAT, json=body, headers={"X-Semif-Deadline": "300"}, timeout=300
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["semif"]["choice"] in ROUTE["options"]


def test_a_deadline_past_the_maximum_is_cut_to_it_and_named(llama, logs_dir):
    for url in _settled_proxy(
        llama, logs_dir, "--decision-deadline-s", "1", "--max-decision-deadline-s", "2"
    ):
        resp = httpx.post(
            url + CHAT, json=_chat(12, 40), headers={"X-Semif-Deadline": "900"}, timeout=120
        )
        assert resp.status_code == 400, resp.text
        assert (
            "the deadline is 2 s (X-Semif-Deadline asked for 900 s; the server's maximum): "
            "send a shorter conversation or fewer options, or start the proxy with a longer "
            "--max-decision-deadline-s"
        ) in resp.json()["error"]["message"]


def test_the_sdks_timeout_shortens_the_deadline_and_its_default_does_not_lengthen_it(
    proxy_url, one_second
):
    _settled(proxy_url)  # its costs known: a request is estimated
    messages = _chat(13, 80)["messages"]  # about 2,800 tokens: many seconds on a CPU
    short = openai.OpenAI(base_url=proxy_url + "/v1", api_key="x", timeout=4.0, max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        short.chat.completions.create(model="m", messages=messages, extra_body={"semif": ROUTE})
    assert caught.value.code == "exceeds_deadline"
    assert "the deadline is 4 s (X-Stainless-Read-Timeout)" in caught.value.message
    # the SDK's default (600 s) leaves the server's own 1 s as it is
    default = openai.OpenAI(base_url=one_second + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        default.chat.completions.create(model="m", messages=messages, extra_body={"semif": ROUTE})
    assert "the deadline is 1 s: send" in caught.value.message


def test_sagemakers_custom_attributes_set_the_deadline_through_invocations(one_second):
    body = {
        "model": "jev-latest",
        "state": _long(14, 40),
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"billing": None, "shipping": None},
            }
        },
    }
    resp = httpx.post(one_second + "/invocations", json=body, timeout=120)
    assert resp.status_code == 422, resp.text  # System One's refusal of its own shape
    assert "the deadline is 1 s" in str(resp.json()["detail"])
    resp = httpx.post(
        one_second + "/invocations",
        json=body,
        headers={"X-Amzn-SageMaker-Custom-Attributes": "trace=abc, semif-deadline=300"},
        timeout=300,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["answers"]["team"]["choice"] in ("billing", "shipping")
