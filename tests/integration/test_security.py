"""The llama-server key stays secret, bodies stay out of logs, only the configured
upstream is ever called."""

import contextlib
import socket

import httpx
import pytest

from scripts.stack import start_llama_server, stop, wait_ready
from tests.conftest import binaries, free_port, launch_proxy
from tests.standin import StandIn

UPSTREAM_KEY = "llama-secret-7c1e"
SECRET_TEXT = "customer-secret-text-42"


@pytest.fixture(scope="module")
def keyed(logs_dir):
    """llama-server that demands a key, and a proxy that has it."""
    binary, model = binaries()
    port = free_port()
    with contextlib.ExitStack() as started:  # stopped in reverse, also when a start fails
        llama_log = started.enter_context(open(logs_dir / "keyed-llama.log", "ab"))
        llama = start_llama_server(binary, model, port, ["--api-key", UPSTREAM_KEY], log=llama_log)
        started.callback(stop, llama)
        wait_ready(f"http://127.0.0.1:{port}/health", llama)
        upstream = f"http://127.0.0.1:{port}"
        logs = []
        urls = []
        for env in ({"UPSTREAM_API_KEY": UPSTREAM_KEY}, {}):
            proc, url, log = launch_proxy(logs_dir, upstream, env=env)
            started.callback(log.close)
            started.callback(stop, proc)
            logs.append(log.name)
            urls.append(url)
        yield urls[0], urls[1], logs


def test_the_upstream_key_never_leaks(keyed):
    url, keyless_url, log_files = keyed
    seen = []
    messages = [{"role": "user", "content": f"Ticket {SECRET_TEXT}: refund"}]
    calls = [
        (url, "/v1/chat/completions", {"messages": messages, "semif": {"options": ["a", "b"]}}),
        (url, "/v1/chat/completions", {"messages": messages, "max_tokens": 3}),
        (url, "/v1/chat/completions", {"messages": messages, "semif": {"options": ["a"]}}),
        (url, "/v1/chat/completions", {"messages": "bad"}),
        (url, "/v1/systemone", {"state": SECRET_TEXT, "questions": {"q": {"type": "noul"}}}),
        (
            keyless_url,
            "/v1/chat/completions",
            {"messages": messages, "semif": {"options": ["a", "b"]}},
        ),
        (keyless_url, "/v1/chat/completions", {"messages": messages, "max_tokens": 3}),
    ]
    statuses = []
    for base, path, body in calls:
        resp = httpx.post(base + path, json=body, timeout=60)
        statuses.append(resp.status_code)
        seen.append(resp.text + str(resp.headers))
    assert statuses[:2] == [200, 200] and statuses[4] == 200
    assert statuses[5] == 502  # llama-server refused the keyless proxy: our fault, not the client's
    seen += [
        httpx.get(base + p).text for base in (url, keyless_url) for p in ("/metrics", "/v1/models")
    ]
    for text in seen:
        assert UPSTREAM_KEY not in text
    for name in log_files:
        with open(name, encoding="utf-8", errors="replace") as f:
            logged = f.read()
        assert UPSTREAM_KEY not in logged
        assert SECRET_TEXT not in logged  # request bodies are not logged


def test_only_the_configured_upstream_is_called(logs_dir):
    with StandIn() as configured, StandIn() as elsewhere:
        proc, url, log = launch_proxy(logs_dir, configured.url)
        try:
            host, port = url.removeprefix("http://").split(":")
            other = elsewhere.url.removeprefix("http://")
            targets = [
                f"http://{other}/v1/models",
                f"//{other}/v1/models",
                "/v1/models?url=" + elsewhere.url,
                "/v1/../v1/models",
            ]
            for target in targets:
                with socket.create_connection((host, int(port))) as sock:
                    sock.sendall(
                        f"GET {target} HTTP/1.1\r\nHost: {other}\r\n"
                        f"X-Forwarded-Host: {other}\r\nConnection: close\r\n\r\n".encode()
                    )
                    reply = sock.recv(65536)
                assert reply.startswith(b"HTTP/1.1 ")
            assert elsewhere.hits == 0
            assert configured.hits > 0
        finally:
            stop(proc)
            log.close()
