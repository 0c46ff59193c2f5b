"""PROXY_API_KEY protects every route but /health, /ping and /metrics."""

import httpx
import pytest
from typesafe_sdk import Noul, TypeSafeAuthenticationError, TypeSafeClient

from scripts.stack import stop
from tests.conftest import launch_proxy

KEY = "s3cret-key"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "semif": {"options": ["a", "b"]}}
S1 = {"state": "s", "questions": {"q": {"type": "noul"}}}


@pytest.fixture(scope="module")
def locked(llama, logs_dir):
    proc, url, log = launch_proxy(logs_dir, llama.url, env={"PROXY_API_KEY": KEY})
    yield url
    stop(proc)
    log.close()


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/systemone", S1)])
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {KEY}", "Bearer"])
def test_requests_without_the_key_get_401(locked, path, body, header):
    headers = {"Authorization": header} if header else {}
    assert httpx.post(locked + path, json=body, headers=headers, timeout=60).status_code == 401


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/systemone", S1)])
def test_requests_with_the_key_pass(locked, path, body):
    resp = httpx.post(
        locked + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert resp.status_code == 200


@pytest.mark.parametrize("path", ["/health", "/ping", "/metrics"])
def test_operational_routes_stay_open(locked, path):
    assert httpx.get(locked + path).status_code == 200


def test_typesafe_sdk_with_and_without_the_key(locked):
    with TypeSafeClient(base_url=locked, api_key=KEY) as client:
        assert 0 < client.system_one("s", {"q": Noul(instructions="yes?")}).answers["q"].noul < 1
    with TypeSafeClient(base_url=locked, api_key="nope") as client:
        with pytest.raises(TypeSafeAuthenticationError):
            client.system_one("s", {"q": Noul(instructions="yes?")})


def test_undecodable_authorization_header_is_401_not_500(locked):
    import socket

    host, port = locked.removeprefix("http://").split(":")
    body = b'{"state": "s", "questions": {"q": {"type": "noul"}}}'
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 401 ")


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/invocations", S1, "error"),  # authentication comes before the body is read
        ("/invocations", CHAT, "error"),
        ("/v1/systemone", S1, "detail"),
        ("/v1/chat/completions", CHAT, "error"),
    ],
)
def test_401_has_the_same_body_whether_or_not_the_model_is_known(locked, path, body, shape):
    first = httpx.post(locked + path, json=body, timeout=60)
    # a good request makes the served model known to the proxy
    assert (
        httpx.post(
            locked + "/v1/systemone",
            json=S1,
            timeout=60,
            headers={"Authorization": f"Bearer {KEY}"},
        ).status_code
        == 200
    )
    second = httpx.post(locked + path, json=body, timeout=60)
    assert first.status_code == second.status_code == 401
    assert list(first.json()) == list(second.json()) == [shape]
