"""The proxy stays up and exact when llama-server, the network or clients misbehave."""

import asyncio
import os
import socket
import threading
import time

import aiohttp
import httpx
import pytest
from aiohttp import web

from proxy.app import create_app
from proxy.config import Settings
from scripts.stack import stop
from tests.conftest import free_port, launch_llama, launch_proxy, wait_for_self_check
from tests.standin import StandIn

DECISION = {
    "messages": [{"role": "user", "content": "Ticket: where is my parcel?"}],
    "semif": {"options": ["billing", "shipping", "technical"]},
}


@pytest.fixture(scope="module")
def standin_proxy(logs_dir):
    with StandIn() as standin:
        proc, url, log = launch_proxy(
            logs_dir, standin.url, "--decision-deadline-s", "1.5", "--request-timeout-s", "10"
        )
        yield standin, url
        stop(proc)
        log.close()


@pytest.mark.parametrize(
    ("mode", "status", "says"),
    [
        ("truncated", 502, "cut short"),
        ("invalid_json", 502, "invalid JSON"),
        ("error_500", 502, "CUDA out of memory"),
        ("loading", 503, "Loading model"),
        ("good", 200, None),
    ],
)
def test_upstream_answers_map_to_status(standin_proxy, mode, status, says):
    standin, url = standin_proxy
    standin.mode = mode
    resp = httpx.post(url + "/v1/chat/completions", json=DECISION, timeout=30)
    assert resp.status_code == status, resp.text
    if says:
        assert says in resp.json()["error"]["message"]


def test_slow_upstream_gets_504_at_the_deadline_and_is_cancelled(standin_proxy):
    standin, url = standin_proxy
    standin.mode, standin.delay_s = "slow", 6.0
    before = standin.cancelled
    started = time.monotonic()
    resp = httpx.post(url + "/v1/chat/completions", json=DECISION, timeout=30)
    elapsed = time.monotonic() - started
    assert resp.status_code == 504
    assert "deadline" in resp.json()["error"]["message"]
    assert 1.4 < elapsed < 5.5  # the 1.5 s deadline, not the stand-in's 6 s answer
    deadline = time.monotonic() + 10
    while standin.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert standin.cancelled == before + 1  # the upstream call was closed, not left running


def test_llama_killed_mid_requests_then_restarted(logs_dir):
    port = free_port()
    llama_proc, server, llama_log = launch_llama(logs_dir, "killed", port)
    proxy_proc, url, proxy_log = launch_proxy(logs_dir, server.url)
    try:
        slow = {**DECISION, "semif": {"options": [f"queue {i}" for i in range(80)]}}
        results: list[int] = []

        def call(body):
            try:
                resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
            except httpx.HTTPError as exc:  # a hang or a broken response fails the test below
                results.append(repr(exc))
                return
            if body.get("stream") and resp.status_code == 200:
                # a stream that had started ends with an error event instead
                last = [line for line in resp.text.splitlines() if line.startswith("data: ")][-1]
                results.append(
                    502 if '"error"' in last and '"upstream_' in last else f"no error event: {last}"
                )
            else:
                results.append(resp.status_code)

        stream_body = {
            "messages": DECISION["messages"],
            "max_tokens": 2000,
            "stream": True,
            "ignore_eos": True,
        }  # still generating when llama-server dies
        threads = [threading.Thread(target=call, args=(b,)) for b in (slow, slow, stream_body)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        llama_proc.kill()
        llama_proc.wait()
        started = time.monotonic()
        for t in threads:
            t.join(30)
        assert time.monotonic() - started < 10  # nothing hangs
        assert all(r in (200, 502, 503) for r in results), results
        assert any(r in (502, 503) for r in results), results
        llama_proc, _, llama_log2 = launch_llama(logs_dir, "killed", port)
        resp = httpx.post(url + "/v1/chat/completions", json=DECISION, timeout=60)
        assert resp.status_code == 200
        llama_log2.close()
    finally:
        stop(proxy_proc)
        stop(llama_proc)
        proxy_log.close()
        llama_log.close()


async def _serve_in_process(upstream_url):
    app = create_app(Settings(upstream_url=upstream_url))
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_client_disconnects_leak_no_task_connection_or_fd(llama):
    runner, url = await _serve_in_process(llama.url)
    try:
        async with aiohttp.ClientSession() as warm:  # labels, pools and caches settle first
            async with warm.post(url + "/v1/chat/completions", json=DECISION) as r:
                assert r.status == 200
        await asyncio.sleep(0.2)
        tasks, fds = len(asyncio.all_tasks()), _open_fds()
        for _ in range(3):
            async with aiohttp.ClientSession() as s:
                body = {"messages": DECISION["messages"], "max_tokens": 500, "stream": True}
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    await r.content.readline()  # mid-stream
            async with aiohttp.ClientSession() as s:
                nonce = time.monotonic_ns() % 10_000
                slow = {**DECISION, "semif": {"options": [f"x{i}-{nonce}" for i in range(8)]}}
                with pytest.raises(asyncio.TimeoutError):
                    async with s.post(
                        url + "/v1/chat/completions",
                        json=slow,
                        timeout=aiohttp.ClientTimeout(total=0.05),
                    ):
                        pass  # mid-request
        await asyncio.sleep(1.0)
        assert len(asyncio.all_tasks()) <= tasks
        assert _open_fds() <= fds
    finally:
        await runner.cleanup()


def test_slow_clients_do_not_block_others(proxy_url):
    host, port = proxy_url.removeprefix("http://").split(":")
    body = b'{"messages": [{"role": "user", "content": "hi"}], "semif": {"options": ["a", "b"]}}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    stop_drip = threading.Event()

    def drip():
        with socket.create_connection((host, int(port))) as sock:
            for byte in request:
                if stop_drip.is_set():
                    return
                sock.send(bytes([byte]))
                time.sleep(0.05)

    httpx.post(proxy_url + "/v1/chat/completions", json=DECISION, timeout=30)  # warm
    wait_for_self_check(proxy_url)  # it leases every slot while it reads
    drippers = [threading.Thread(target=drip) for _ in range(8)]
    for d in drippers:
        d.start()
    try:
        time.sleep(0.3)
        for _ in range(3):
            started = time.monotonic()
            assert (
                httpx.post(
                    proxy_url + "/v1/chat/completions", json=DECISION, timeout=30
                ).status_code
                == 200
            )
            assert time.monotonic() - started < 8  # not held behind the drippers' 8 connections
    finally:
        stop_drip.set()
        for d in drippers:
            d.join(5)


def test_past_the_caps_decisions_get_429_with_retry_after(standin_proxy, logs_dir):
    standin, _ = standin_proxy
    standin.mode, standin.delay_s = "slow", 1.0
    proc, url, log = launch_proxy(
        logs_dir,
        standin.url,
        "--max-active-decisions",
        "1",
        "--max-queued-decisions",
        "1",
        "--retry-after-s",
        "4",
    )
    try:
        results = []

        def call():
            resp = httpx.post(url + "/v1/chat/completions", json=DECISION, timeout=30)
            results.append((resp.status_code, resp.headers.get("Retry-After")))

        threads = [threading.Thread(target=call) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        statuses = sorted(status for status, _ in results)
        assert statuses == [200, 200, 429, 429, 429]  # one runs, one waits, the rest are refused
        assert all(after == "4" for status, after in results if status == 429)
        plain = httpx.post(url + "/v1/chat/completions", json={"messages": DECISION["messages"]})
        assert plain.status_code == 200  # relays are not decisions and are never refused
    finally:
        stop(proc)
        log.close()
        standin.mode = "good"


def test_invalid_system_one_body_is_422_even_when_llama_server_is_down(logs_dir):
    proc, url, log = launch_proxy(logs_dir, f"http://127.0.0.1:{free_port()}")
    try:
        bad = httpx.post(url + "/v1/systemone", json={"state": None, "questions": {}}, timeout=10)
        assert bad.status_code == 422
        good = httpx.post(
            url + "/v1/systemone",
            timeout=10,
            json={"state": "s", "questions": {"q": {"type": "noul"}}},
        )
        assert good.status_code == 503 and good.headers["Retry-After"]
    finally:
        stop(proc)
        log.close()
