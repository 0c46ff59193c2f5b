"""The proxy as a complete front for llama-server: every path it does not answer itself
is relayed unchanged; the routes that control the server need the admin key."""

from __future__ import annotations

import httpx
import pytest

from scripts.stack import stop
from tests.conftest import launch_proxy

ADMIN = "admin-9f2e"
HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def fronted(llama, logs_dir):
    proc, url, log = launch_proxy(logs_dir, llama.url, env={"PROXY_ADMIN_KEY": ADMIN})
    yield url
    stop(proc)
    log.close()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/completion", {"prompt": "Hello", "n_predict": 2, "temperature": 0}),
        ("POST", "/tokenize", {"content": "Hello world"}),
        ("POST", "/detokenize", {"tokens": [19556, 905]}),
        ("POST", "/apply-template", {"messages": HI}),
        ("POST", "/v1/responses", {"input": "Say hi.", "max_output_tokens": 2, "temperature": 0}),
        ("POST", "/v1/messages", {"messages": HI, "max_tokens": 2, "temperature": 0}),
        ("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0}),
        ("GET", "/props", None),
        ("GET", "/slots", None),
        ("GET", "/", None),  # the web UI where the build has one (this one answers 404)
    ],
)
def test_llama_servers_own_routes_answer_as_they_do_directly(fronted, llama, method, path, body):
    via = httpx.request(method, fronted + path, json=body, timeout=60)
    direct = httpx.request(method, llama.url + path, json=body, timeout=60)
    assert via.status_code == direct.status_code, (via.status_code, via.text[:300])
    assert via.status_code == 200 or path == "/"
    assert via.headers["content-type"] == direct.headers["content-type"]
    if path == "/":
        assert via.content == direct.content
    if path in ("/tokenize", "/detokenize", "/apply-template"):
        assert via.json() == direct.json()


def test_a_cors_preflight_is_answered_by_llama_server(fronted, llama):
    headers = {
        "Origin": "http://example.test",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    via = httpx.options(fronted + "/v1/chat/completions", headers=headers, timeout=10)
    direct = httpx.options(llama.url + "/v1/chat/completions", headers=headers, timeout=10)
    assert via.status_code == direct.status_code
    assert via.status_code < 400
    for name in ("access-control-allow-origin", "access-control-allow-methods"):
        assert via.headers.get(name) == direct.headers.get(name)


@pytest.mark.parametrize("headers", [{}, {"X-Admin-Key": "wrong"}])
def test_erasing_a_slot_without_the_admin_key_is_refused(fronted, headers):
    resp = httpx.post(fronted + "/slots/0?action=erase", headers=headers, timeout=10)
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "admin_key_required"
    assert resp.json()["error"]["param"] == "X-Admin-Key"
    assert httpx.post(fronted + "/props", json={}, headers=headers, timeout=10).status_code == 403


def test_the_admin_key_unlocks_the_control_routes(fronted, llama):
    resp = httpx.post(fronted + "/slots/0?action=erase", headers={"X-Admin-Key": ADMIN}, timeout=10)
    direct = httpx.post(llama.url + "/slots/0?action=erase", timeout=10)
    # llama-server's own answer, whatever it is (this build, started without
    # --slot-save-path, answers 501): not the proxy's 403
    assert resp.status_code == direct.status_code != 403
    assert resp.json() == direct.json()


def test_without_a_configured_admin_key_control_routes_are_always_refused(proxy_url):
    resp = httpx.post(proxy_url + "/slots/0?action=erase", headers={"X-Admin-Key": ""}, timeout=10)
    assert resp.status_code == 403


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/made-up-control"),  # a route on neither list (tests/unit/test_route_access.py)
        ("PUT", "/props"),
        ("POST", "/lora-adapters"),  # issue 53: relayed to any client before the allow-list
        ("POST", "/models/load"),
        # a web UI file's prefix and a way out: the relay would send it as /cors-proxy
        ("GET", "/_app/%2E%2E/cors-proxy"),
        ("GET", "/_app%2F..%2Fcors-proxy"),
    ],
)
def test_a_route_a_client_may_not_call_is_refused_naming_the_admin_key(fronted, method, path):
    resp = httpx.request(method, fronted + path, json={}, timeout=10)
    assert resp.status_code == 403
    error = resp.json()["error"]
    assert error["code"] == "admin_key_required"
    assert "X-Admin-Key" in error["message"] and error["param"] == "X-Admin-Key"


def test_with_the_admin_key_a_made_up_route_is_relayed(fronted, llama):
    via = httpx.post(
        fronted + "/made-up-control", json={}, headers={"X-Admin-Key": ADMIN}, timeout=10
    )
    direct = httpx.post(llama.url + "/made-up-control", json={}, timeout=10)
    assert via.status_code == direct.status_code == 404  # llama-server's own answer


@pytest.mark.parametrize(
    ("method", "path"),
    [("HEAD", "/props"), ("HEAD", "/slots"), ("OPTIONS", "/slots/0"), ("OPTIONS", "/made-up")],
)
def test_head_of_an_allowed_get_and_any_preflight_are_relayed(fronted, llama, method, path):
    headers = {"Origin": "http://example.test", "Access-Control-Request-Method": "POST"}
    via = httpx.request(method, fronted + path, headers=headers, timeout=10)
    direct = httpx.request(method, llama.url + path, headers=headers, timeout=10)
    assert via.status_code == direct.status_code != 403
