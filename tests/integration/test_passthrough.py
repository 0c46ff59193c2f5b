"""Requests without semif reach llama-server unchanged and come back unchanged."""

import time

import httpx
import openai
import pytest

PLAIN = {
    "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
    "temperature": 0,
    "seed": 7,
    "max_tokens": 24,
}
VOLATILE = {"id", "created", "timings", "usage"}


def _stable(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in VOLATILE}


def test_plain_request_gets_the_same_answer_as_llama_server(proxy_url, llama):
    via_proxy = httpx.post(proxy_url + "/v1/chat/completions", json=PLAIN, timeout=60)
    direct = httpx.post(llama.url + "/v1/chat/completions", json=PLAIN, timeout=60)
    assert via_proxy.status_code == direct.status_code == 200
    assert _stable(via_proxy.json()) == _stable(direct.json())
    assert (
        via_proxy.json()["usage"]["completion_tokens"]
        == direct.json()["usage"]["completion_tokens"]
    )


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}},
        {"messages": [{"role": "user", "content": "hi"}], "n_probs": "many", "max_tokens": 2},
    ],
)
def test_upstream_errors_are_relayed_with_the_same_status_and_body(proxy_url, llama, body):
    via_proxy = httpx.post(proxy_url + "/v1/chat/completions", json=body, timeout=30)
    direct = httpx.post(llama.url + "/v1/chat/completions", json=body, timeout=30)
    assert via_proxy.status_code == direct.status_code >= 400
    assert via_proxy.content == direct.content


def test_plain_stream_arrives_chunk_by_chunk(proxy_url):
    body = {**PLAIN, "stream": True, "max_tokens": 48}
    arrivals = []
    with httpx.stream("POST", proxy_url + "/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                arrivals.append((time.monotonic(), line))
    assert arrivals[-1][1] == "data: [DONE]"
    assert len(arrivals) > 10
    # the first token came well before the last: relayed as generated, not buffered
    assert arrivals[-1][0] - arrivals[0][0] > 0.05


def test_openai_sdk_streams_plain_chat(proxy_url):
    with openai.OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="smollm2", messages=PLAIN["messages"], max_tokens=16, stream=True, temperature=0
        )
        pieces = [
            c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content
        ]
    assert len(pieces) > 3


def test_models_are_relayed_then_the_other_names_listed(proxy_url, llama):
    def models(url):  # "created" is llama-server's clock at the time of asking
        return [
            {k: v for k, v in m.items() if k != "created"}
            for m in httpx.get(url + "/v1/models").json()["data"]
        ]

    direct, through = models(llama.url), models(proxy_url)
    assert through[: len(direct)] == direct  # llama-server's entries first, unchanged
    extra = through[len(direct) :]
    assert {m["id"] for m in extra} >= {"jev-latest", "gpt-6-luna"}
    assert all(m["object"] == "model" for m in extra)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/invocations"])
def test_a_relayed_message_without_a_role_is_a_400_not_llama_servers_500(proxy_url, llama, path):
    body = {"messages": [{"content": "hi"}], "max_tokens": 1}
    assert httpx.post(llama.url + "/v1/chat/completions", json=body, timeout=30).status_code == 500
    resp = httpx.post(proxy_url + path, json=body, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "messages.0.role"
