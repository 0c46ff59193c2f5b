"""Relayed traffic checked and bounded, against the real llama-server: a chat body it
cannot read is our 400 (not its 500), a generation that names no length gets the cap, one
that asks for more is refused, and a client that leaves stops llama-server's work."""

import http.client
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from scripts.stack import stop
from tests.conftest import LlamaServer, launch_proxy

CAP = 8  # the dedicated proxy's --relay-max-tokens
NO_TEXT = {"messages": [{"content": [{"type": "text"}], "role": ""}]}  # schemathesis's find
MESSAGES = [{"role": "user", "content": "Tell a long story about the sea."}]
# a generation that would run for minutes on a small CPU unless it is stopped
LONG = {"messages": MESSAGES, "max_tokens": 2000, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def capped_url(llama: LlamaServer, logs_dir) -> Iterator[str]:
    proc, url, log = launch_proxy(logs_dir, llama.url, "--relay-max-tokens", str(CAP))
    yield url
    stop(proc)
    log.close()


@pytest.fixture(scope="module")
def patient_url(llama: LlamaServer, logs_dir) -> Iterator[str]:
    """A proxy that waits 10 minutes for llama-server's answer: only the client's leaving,
    not the proxy's own timeout, can stop a generation here."""
    proc, url, log = launch_proxy(logs_dir, llama.url, "--request-timeout-s", "600")
    yield url
    stop(proc)
    log.close()


def _predicted(llama: LlamaServer) -> int:
    """Tokens llama-server has generated since it started (its /metrics counter)."""
    for line in httpx.get(llama.url + "/metrics", timeout=120).text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total "):
            return int(float(line.split()[1]))
    raise AssertionError("llama-server's /metrics has no tokens_predicted_total")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/invocations", "/chat/completions"])
def test_a_text_part_without_text_is_a_400_not_llama_servers_500(proxy_url, llama, path):
    assert (
        httpx.post(llama.url + "/v1/chat/completions", json=NO_TEXT, timeout=30).status_code == 500
    )
    resp = httpx.post(proxy_url + path, json=NO_TEXT, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == {
        "message": "each text part needs text, a string",
        "type": "invalid_request_error",
        "param": "messages.0.content.0.text",
        "code": "invalid_request",
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),  # llama-server generates from nothing
        ({"messages": [{"role": "user", "content": "hi", "name": None}]}, "messages.0.name"),
        ({"messages": MESSAGES, "tools": [5]}, "tools.0"),
        (
            {"messages": [{"role": "user", "content": [{"type": "martian"}]}]},
            "messages.0.content.0.type",
        ),
    ],
)
def test_other_chat_bodies_llama_server_cannot_read_are_400s(proxy_url, body, param):
    resp = httpx.post(
        proxy_url + "/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=30
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("path", "body", "count"),
    [
        (
            "/v1/chat/completions",
            {"messages": MESSAGES},
            lambda answer: answer["usage"]["completion_tokens"],
        ),
        (
            "/invocations",
            {"messages": MESSAGES},
            lambda answer: answer["usage"]["completion_tokens"],
        ),
        (
            "/v1/completions",
            {"prompt": "Once upon a time"},
            lambda answer: answer["usage"]["completion_tokens"],
        ),
        (
            "/completion",
            {"prompt": "Once upon a time"},
            lambda answer: answer["timings"]["predicted_n"],
        ),
    ],
)
def test_a_generation_that_names_no_length_stops_at_the_cap(capped_url, path, body, count):
    resp = httpx.post(
        capped_url + path, json={**body, "ignore_eos": True, "temperature": 0}, timeout=120
    )
    assert resp.status_code == 200, resp.text
    assert count(resp.json()) == CAP


def test_a_generation_within_the_cap_keeps_its_own_length(capped_url):
    resp = httpx.post(
        capped_url + "/completion",
        json={"prompt": "Once upon a time", "n_predict": 3, "ignore_eos": True},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["timings"]["predicted_n"] == 3


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": CAP + 1}, "max_tokens"),
        (
            "/invocations",
            {"messages": MESSAGES, "max_completion_tokens": 100},
            "max_completion_tokens",
        ),
        ("/completion", {"prompt": "Once", "n_predict": -1}, "n_predict"),
        ("/v1/completions", {"prompt": "Once", "max_tokens": 10**9}, "max_tokens"),
    ],
)
def test_a_generation_over_the_cap_is_refused_naming_it(capped_url, path, body, param):
    resp = httpx.post(capped_url + path, json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == (param, "over_token_cap")
    assert f"ask for at most {CAP}" in error["message"]
    assert "PROXY_RELAY_MAX_TOKENS" in error["message"]


def test_the_default_cap_is_2048_tokens(proxy_url):
    resp = httpx.post(
        proxy_url + "/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 4000},
        timeout=30,
    )
    assert resp.status_code == 400, resp.text
    assert "cap of 2048 tokens" in resp.json()["error"]["message"]


def _in_flight(url: str, route: str) -> str:
    line = f'semif_requests_in_flight{{route="{route}"}} '
    return next(
        x for x in httpx.get(url + "/metrics").text.splitlines() if x.startswith(line)
    ).removeprefix(line)


def _wait_idle_quietly(llama: LlamaServer, timeout_s: float = 120, every_s: float = 2.5) -> None:
    """Until no slot works, asking seldom: llama-server (b11434) looks at a non-streamed
    request's connection only after a second in which no result of any task was posted,
    and each answer to /slots is one."""
    deadline = time.monotonic() + timeout_s
    while llama.busy_slots():
        assert time.monotonic() < deadline, "llama-server stayed busy"
        time.sleep(every_s)


def test_a_client_that_leaves_a_stream_stops_the_generation(patient_url, llama):
    llama.wait_idle(timeout_s=120)
    before = _predicted(llama)
    with httpx.Client(timeout=120) as client:
        with client.stream(
            "POST", patient_url + "/v1/chat/completions", json={**LONG, "stream": True}
        ) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    break  # the generation has started; leave mid-stream
    llama.wait_idle(timeout_s=120)
    assert _predicted(llama) - before < LONG["max_tokens"]  # stopped, not finished
    assert _in_flight(patient_url, "/v1/chat/completions") == "0.0"


def test_a_client_that_leaves_before_the_answer_stops_the_generation(patient_url, llama):
    llama.wait_idle(timeout_s=120)
    before = _predicted(llama)
    address = urlsplit(patient_url)
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=orjson.dumps(LONG),
            headers={"Content-Type": "application/json"},
        )
        deadline = time.monotonic() + 120
        while not llama.busy_slots():
            assert time.monotonic() < deadline, "the generation never started"
            time.sleep(0.05)
    finally:
        conn.close()  # no answer read: the client is gone
    _wait_idle_quietly(llama)
    assert _predicted(llama) - before < LONG["max_tokens"]
    assert _in_flight(patient_url, "/v1/chat/completions") == "0.0"
