"""The real proxy over raw sockets (aiohttp's HTTP/1.1 server): decisions and
pass-through share connections, and nothing a client sends is lost, reordered or
answered twice; malformed requests get a prompt 4xx and memory stays bounded."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from scripts.stack import stop
from tests.conftest import launch_proxy, rss_kb

DECISION = {
    "messages": [{"role": "user", "content": "I was charged twice for my order."}],
    "semif": {"options": ["billing", "shipping", "technical"]},
}
PLAIN = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}


def post(path: str, body: dict | bytes, *headers: str, version: str = "HTTP/1.1") -> bytes:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    head = [f"POST {path} {version}", "Host: test", f"Content-Length: {len(data)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


class Client:
    """One connection; answers read one at a time (Content-Length or chunked)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        self.buffer += chunk

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            self._more()
        line, self.buffer = self.buffer.split(marker, 1)
        return line

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._more()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self._until(b"\r\n"), 16):
                body += self._take(size)
                self._take(2)
            self._take(2)
        else:
            body = self._take(int(headers.get("content-length", 0)))
        return status, headers, body

    def closed(self) -> bool:
        self.sock.settimeout(10)
        return self.sock.recv(1) == b""

    def close(self) -> None:
        self.sock.close()


def probabilities(body: bytes) -> dict[str, float]:
    return orjson.loads(body)["semif"]["probabilities"]


@pytest.fixture
def client(proxy_url):
    c = Client(proxy_url)
    yield c
    c.close()


def test_decisions_keep_the_connection(client):
    answers = []
    for _ in range(3):
        client.send(post("/v1/chat/completions", DECISION))
        answers.append(client.answer())
    for status, headers, body in answers:
        assert status == 200 and headers["content-type"] == "application/json"
        assert "date" in headers
        assert sum(probabilities(body).values()) == pytest.approx(1)


def test_pipelined_requests_are_answered_in_order(client):
    other = {**DECISION, "semif": {"options": ["yes", "no"]}}
    client.send(
        post("/v1/chat/completions", DECISION)
        + post("/v1/chat/completions", other)
        + post("/v1/chat/completions", DECISION)
    )
    first, second, third = (client.answer() for _ in range(3))
    assert set(probabilities(first[2])) == {"billing", "shipping", "technical"}
    assert set(probabilities(second[2])) == {"yes", "no"}
    assert set(probabilities(third[2])) == {"billing", "shipping", "technical"}


def test_a_request_arriving_in_pieces_is_answered_once(client):
    data = post("/v1/chat/completions", DECISION)
    for i in range(0, len(data), 7):
        client.send(data[i : i + 7])
        time.sleep(0.002)
    status, _, body = client.answer()
    assert status == 200 and set(probabilities(body)) == {"billing", "shipping", "technical"}


def test_pass_through_and_decisions_share_a_connection(client):
    client.send(post("/v1/chat/completions", DECISION))
    decided = client.answer()
    client.send(post("/v1/chat/completions", PLAIN) + post("/v1/chat/completions", DECISION))
    relayed, after = client.answer(), client.answer()
    assert relayed[0] == 200 and orjson.loads(relayed[2])["object"] == "chat.completion"
    # the same decision before and after a relayed generation has the same shape
    # (not the same digits: llama-server's numerics vary with slot and batch)
    assert after[0] == 200
    assert {
        k: sorted(v) if isinstance(v, dict) else type(v) for k, v in orjson.loads(after[2]).items()
    } == {
        k: sorted(v) if isinstance(v, dict) else type(v)
        for k, v in orjson.loads(decided[2]).items()
    }


@pytest.mark.parametrize(
    "request_bytes",
    [
        post("/v1/chat/completions", DECISION, version="HTTP/1.0"),
        post("/v1/chat/completions", DECISION, "Connection: upgrade", "Upgrade: foo"),
        post("/v1/chat/completions?x=1", DECISION),
        post("/v1/chat/completions", DECISION, "X-Long: " + "a" * 4500, "X-Longer: " + "b" * 4500),
    ],
    ids=["http1.0", "upgrade", "query", "long-head"],
)
def test_unusual_requests_are_answered(client, request_bytes):
    client.send(request_bytes)
    status, headers, body = client.answer()
    assert status == 200 and set(probabilities(body)) == {"billing", "shipping", "technical"}


def test_chunked_request_body_is_answered(client):
    data = orjson.dumps(DECISION)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(data[i : i + 40]), data[i : i + 40]) for i in range(0, len(data), 40)
    )
    client.send(head + chunks + b"0\r\n\r\n")
    status, headers, body = client.answer()
    assert status == 200
    assert set(probabilities(body)) == {"billing", "shipping", "technical"}


def test_expect_100_continue_is_honoured(client):
    data = orjson.dumps(DECISION)
    client.send(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
        b"Content-Length: %d\r\n\r\n" % len(data)
    )
    assert client._until(b"\r\n\r\n").startswith(b"HTTP/1.1 100")
    client.send(data)
    status, _, body = client.answer()
    assert status == 200 and set(probabilities(body)) == {"billing", "shipping", "technical"}


def test_connection_close_is_honoured(client):
    client.send(post("/v1/chat/completions", DECISION, "Connection: close"))
    status, headers, _ = client.answer()
    assert status == 200 and headers["connection"].lower() == "close"
    assert client.closed()


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({**DECISION, "semif": {"options": ["only"]}}, 400, "semif.options"),
        ({**DECISION, "semif": {"options": ["a", "b"], "colour": 1}}, 400, "semif.colour"),
    ],
)
def test_errors_keep_the_connection(client, body, status, param):
    client.send(post("/v1/chat/completions", body) + post("/v1/chat/completions", DECISION))
    (got, headers, error), (ok, _, _) = client.answer(), client.answer()
    assert (got, ok) == (status, 200) and headers["content-type"] == "application/json"
    assert orjson.loads(error)["error"]["param"] == param


def test_every_decision_path_answers_on_one_connection(client, proxy_url):
    httpx.post(
        proxy_url + "/v1/systemone",
        timeout=60,
        json={  # the served model is now known
            "state": "warm-up",
            "questions": {"q": {"type": "noul", "instructions": "Is it?"}},
        },
    )
    system_one = {
        "state": "I was charged twice.",
        "questions": {"q": {"type": "choice", "criteria": ["billing", "shipping"]}},
    }
    decisions = {
        "model": "jev-latest",
        "input": "I was charged twice.",
        "questions": [{"type": "predicate", "name": "q", "instructions": "Is it billing?"}],
    }
    for path, body in [
        ("/v1/systemone", system_one),
        ("/invocations", system_one),
        ("/invocations", DECISION),
        ("/v1/decisions", decisions),
        ("/invocations", decisions),
    ]:
        client.send(post(path, body))
        status, headers, answer = client.answer()
        assert status == 200, (path, answer)
        assert headers["content-type"] == "application/json", path


def test_a_client_that_leaves_cancels_its_decision(llama, logs_dir):
    proc, url, log = launch_proxy(logs_dir, llama.url)
    try:
        slow = {
            "messages": [{"role": "user", "content": f"{time.time()} " + "word " * 1500}],
            "semif": {"options": ["a", "b"]},
        }
        client = Client(url)
        try:
            client.send(post("/v1/chat/completions", slow))
            deadline = time.monotonic() + 60
            while not llama.busy_slots() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert llama.busy_slots()
        finally:
            client.close()
        llama.wait_idle(timeout_s=120)
        metrics = httpx.get(url + "/metrics").text
        assert (
            'semif_request_duration_seconds_count{kind="decision",outcome="client_error",'
            'route="/v1/chat/completions"} 1.0'
        ) in metrics  # recorded as 499
        assert 'semif_requests_in_flight{route="/v1/chat/completions"} 0.0' in metrics
    finally:
        stop(proc)
        log.close()


def test_sigterm_closes_idle_connections_and_exits(llama, logs_dir):
    proc, url, log = launch_proxy(logs_dir, llama.url)
    idle = Client(url)
    try:
        idle.send(post("/v1/chat/completions", DECISION))
        assert idle.answer()[0] == 200
        proc.send_signal(signal.SIGTERM)
        # an idle keep-alive connection holds nothing up: gone well before the 25 s that
        # in-flight requests would get
        assert proc.wait(15) == 0
        assert idle.closed()
    finally:
        idle.close()
        stop(proc)
        log.close()


def _reply_within(url: str, data: bytes, seconds: float) -> bytes:
    c = Client(url)
    try:
        c.sock.settimeout(seconds)
        c.send(data)
        return c.sock.recv(65536)
    finally:
        c.close()


def test_lf_only_line_endings_get_a_prompt_400(proxy_url):
    # prompt: within 10 s, not after the keep-alive or request timeouts
    reply = _reply_within(
        proxy_url, b"POST /v1/chat/completions HTTP/1.1\nHost: t\nContent-Length: 2\n\n{}", 10
    )
    assert reply.startswith(b"HTTP/1.") and b" 400 " in reply.split(b"\r\n")[0]


@pytest.mark.parametrize(
    "head, status",
    [
        (b"X-Big: " + b"a" * 9000 + b"\r\n", 400),  # a field over 8190 bytes
        (b"".join(b"X-H%d: v\r\n" % i for i in range(200)), 400),  # more than 128 fields
        (b"X-A: " + b"b" * 4000 + b"\r\nX-B: " + b"c" * 5000 + b"\r\n", 200),  # under each cap
    ],
    ids=["long-field", "many-fields", "two-long-fields"],
)
def test_aiohttps_header_limits_hold(proxy_url, head, status):
    request = b"GET /health HTTP/1.1\r\nHost: t\r\n" + head + b"\r\n"
    line = _reply_within(proxy_url, request, 10).split(b"\r\n")[0]
    assert line.split(b" ")[1] == b"%d" % status, line  # a parse error answers as HTTP/1.0


def test_a_content_length_of_5000_digits_gets_a_prompt_400_and_one_log_line(llama, logs_dir):
    proc, url, log = launch_proxy(logs_dir, llama.url)
    try:
        reply = _reply_within(
            url,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
            b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n{}",
            5,
        )
        assert b" 400 " in reply.split(b"\r\n")[0]
        time.sleep(0.3)
        text = Path(log.name).read_text(errors="replace")
        assert "Traceback" not in text
        (line,) = [x for x in text.splitlines() if "bad HTTP request" in x]
        assert "Content-Length overflow" in line and len(line) < 400
    finally:
        stop(proc)
        log.close()


def test_a_flood_of_pipelined_bad_requests_never_read_keeps_memory_bounded(llama, logs_dir):
    proc, url, log = launch_proxy(logs_dir, llama.url)
    bad = post("/v1/chat/completions", b"not json")
    client = Client(url)
    try:
        before = rss_kb(proc.pid)
        client.sock.settimeout(3)
        sent = 0
        try:
            while sent < 40_000_000:
                client.send(bad * 1000)
                sent += len(bad) * 1000
        except TimeoutError:
            pass  # the proxy stopped reading: its answers are not being read
        time.sleep(1)
        grown_mb = (rss_kb(proc.pid) - before) / 1024
        assert sent < 40_000_000, "the proxy read 40 MB of requests whose answers nobody read"
        assert grown_mb < 16, f"resident memory grew by {grown_mb:.1f} MB"
        client.close()
        assert httpx.get(url + "/metrics", timeout=10).status_code == 200  # still serving
    finally:
        client.close()
        stop(proc)
        log.close()
