"""Who may call each route of llama-server b11434 through the proxy: no key, a client key
and the admin key, with and without ``PROXY_API_KEY``, and the same with ``PROXY_ADMIN_KEY``
unset. Each route is tried against the real llama-server where it answers there (started as
the tests start it), and against the stand-in where it does not (router mode's routes,
Vertex AI's predict route): a relayed request is one the upstream received."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from scripts import llama_routes
from scripts.stack import stop
from tests.conftest import launch_proxy
from tests.standin import StandIn

CLIENT_KEY = "client-5d1e"
ADMIN_KEY = "admin-9f2e"
HI = [{"role": "user", "content": "Say hi."}]
# the proxy's own answers: tests/unit/test_route_access.py holds them to these
OURS = {
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/systemone"),
    ("POST", "/rerank"),
    ("POST", "/reranking"),
    ("POST", "/v1/rerank"),
    ("POST", "/v1/reranking"),
}


class Route:
    def __init__(self, route: str, who: str, *, path: str = "", body: Any = None, standin=False):
        self.method, self.pattern = route.split(" ", 1)
        self.who = who  # "client": the client key may call it; "admin": only the admin key
        self.path = path or self.pattern
        self.body = body
        self.standin = standin  # not served by the tests' llama-server (router mode, Vertex)

    def __repr__(self) -> str:
        return f"{self.method} {self.path}"


# every route of b11434 but the proxy's own answers, as issue 53 sorts them
ROUTES = [
    Route("POST /models", "admin", body={"model": "x"}, standin=True),
    Route("POST /models/load", "admin", body={"model": "x"}, standin=True),
    Route("POST /models/unload", "admin", body={"model": "x"}, standin=True),
    Route("GET /models/sse", "admin", standin=True),
    Route("DELETE /models", "admin", standin=True),
    Route("GET /v1/health", "client"),
    Route("GET /props", "client"),
    Route("POST /props", "admin", body={}),
    Route("GET /models", "client"),
    Route("POST /completion", "client", body={"prompt": "Hi", "n_predict": 1}),
    Route("POST /completions", "client", body={"prompt": "Hi", "n_predict": 1}),
    Route("POST /v1/completions", "client", body={"prompt": "Hi", "max_tokens": 1}),
    Route("POST /chat/completions", "client", body={"messages": HI, "max_tokens": 1}),
    Route(
        "POST /v1/chat/completions/control",
        "client",
        body={"id": "chatcmpl-none", "action": "reasoning_end"},
    ),
    Route("POST /v1/responses", "client", body={"input": "Hi", "max_output_tokens": 1}),
    Route("POST /responses", "client", body={"input": "Hi", "max_output_tokens": 1}),
    Route("POST /v1/audio/transcriptions", "client", body={}),
    Route("POST /audio/transcriptions", "client", body={}),
    Route("POST /v1/messages", "client", body={"messages": HI, "max_tokens": 1}),
    Route("POST /infill", "client", body={"input_prefix": "def f(", "n_predict": 1}),
    Route("POST /embedding", "client", body={"content": "Hi"}),
    Route("POST /embeddings", "client", body={"content": "Hi"}),
    Route("POST /v1/embeddings", "client", body={"input": "Hi"}),
    Route("POST /tokenize", "client", body={"content": "Hi"}),
    Route("POST /detokenize", "client", body={"tokens": [19556]}),
    Route("POST /apply-template", "client", body={"messages": HI}),
    Route("POST /chat/completions/input_tokens", "client", body={"messages": HI}),
    Route("POST /v1/chat/completions/input_tokens", "client", body={"messages": HI}),
    Route("POST /responses/input_tokens", "client", body={"input": "Hi"}),
    Route("POST /v1/responses/input_tokens", "client", body={"input": "Hi"}),
    Route("POST /v1/messages/count_tokens", "client", body={"messages": HI}),
    Route("GET /lora-adapters", "client"),
    Route("POST /lora-adapters", "admin", body=[]),
    Route("GET /slots", "client"),
    Route("POST /slots/:id_slot", "admin", path="/slots/0?action=erase"),
    Route("GET /v1/stream", "client", path="/v1/stream?conv_id=none"),
    Route("POST /v1/streams/lookup", "client", body={"conversation_ids": ["none"]}),
    Route("DELETE /v1/stream", "client", path="/v1/stream?conv_id=none"),
    Route("GET /cors-proxy", "admin", path="/cors-proxy?url=http://127.0.0.1:9/"),
    Route("POST /cors-proxy", "admin", body={"url": "http://127.0.0.1:9/"}),
    Route("GET /tools", "admin"),
    Route("POST /tools", "admin", body={}),
    Route("GET /", "client"),
    Route("GET /index.html", "client"),
    Route("GET /sw.js", "client"),
    Route("POST /predict", "admin", body={"instances": []}, standin=True),
]

CLIENT = {"Authorization": f"Bearer {CLIENT_KEY}"}
ADMIN = {**CLIENT, "X-Admin-Key": ADMIN_KEY}
# a proxy's keys -> each caller: its headers and what it may reach ("none": 401 for all,
# "client": the client routes, "all": every route)
SETUPS: dict[str, tuple[dict[str, str], dict[str, tuple[dict[str, str], str]]]] = {
    "both keys": (
        {"PROXY_API_KEY": CLIENT_KEY, "PROXY_ADMIN_KEY": ADMIN_KEY},
        {"no key": ({}, "none"), "client key": (CLIENT, "client"), "admin key": (ADMIN, "all")},
    ),
    "no PROXY_API_KEY": (
        {"PROXY_ADMIN_KEY": ADMIN_KEY},
        {"no key": ({}, "client"), "admin key": ({"X-Admin-Key": ADMIN_KEY}, "all")},
    ),
    "no PROXY_ADMIN_KEY": (
        {"PROXY_API_KEY": CLIENT_KEY},
        {"no key": ({}, "none"), "client key": (CLIENT, "client"), "admin key": (ADMIN, "client")},
    ),
}


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


@pytest.fixture(scope="module")
def proxies(llama, standin, logs_dir) -> Iterator[dict[tuple[str, bool], str]]:
    """One proxy per setup and upstream: (setup, in front of the stand-in) -> its URL."""
    started: dict[tuple[str, bool], str] = {}
    running = []
    try:
        for name, (env, _) in SETUPS.items():
            for on_standin in (False, True):
                upstream = standin.url if on_standin else llama.url
                proc, url, log = launch_proxy(logs_dir, upstream, env=env)
                running.append((proc, log))
                started[(name, on_standin)] = url
        yield started
    finally:
        for proc, log in running:
            stop(proc)
            log.close()


def _refused(resp: httpx.Response) -> str | None:
    """The proxy's own refusal code (401 invalid_api_key, 403 admin_key_required), if any."""
    if resp.status_code not in (401, 403):
        return None
    try:
        code = resp.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if code in ("invalid_api_key", "admin_key_required") else None


def _send(url: str, route: Route, headers: dict[str, str]) -> httpx.Response:
    body = {} if route.body is None else {"json": route.body}
    return httpx.request(route.method, url + route.path, headers=headers, timeout=60, **body)


def test_every_route_of_the_pinned_build_is_tried_here():
    tried = {(r.method, r.pattern) for r in ROUTES}
    assert tried | OURS == set(llama_routes.read())
    assert not tried & OURS


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("route", ROUTES, ids=repr)
def test_each_caller_reaches_what_its_key_allows(proxies, llama, standin, setup, route):
    _, callers = SETUPS[setup]
    url = proxies[(setup, route.standin)]
    direct = None if route.standin else _send(llama.url, route, {})
    for caller, (headers, reach) in callers.items():
        seen = len(standin.seen)
        resp = _send(url, route, headers)
        relayed = (
            (route.method, route.path.split("?")[0]) in standin.seen[seen:]
            if route.standin
            else _refused(resp) is None
        )
        where = f"{setup}, {caller}: {resp.status_code} {resp.text[:200]}"
        if reach == "none":
            assert _refused(resp) == "invalid_api_key", where
        elif reach == "all" or route.who == "client":
            assert relayed, where
            if direct is not None:  # llama-server's own answer, whatever it is
                assert resp.status_code == direct.status_code, where
        else:
            assert _refused(resp) == "admin_key_required", where
            assert "X-Admin-Key" in resp.json()["error"]["message"], where
            assert not relayed, where


@pytest.mark.parametrize("setup", SETUPS)
def test_a_made_up_route_is_refused_to_the_client_key_and_relayed_with_the_admin_key(
    proxies, standin, setup
):
    made_up = Route("POST /made-up-control", "admin", body={})
    _, callers = SETUPS[setup]
    for caller, (headers, reach) in callers.items():
        seen = len(standin.seen)
        resp = _send(proxies[(setup, True)], made_up, headers)
        relayed = ("POST", "/made-up-control") in standin.seen[seen:]
        where = f"{setup}, {caller}: {resp.status_code} {resp.text[:200]}"
        if reach == "all":
            assert relayed and resp.status_code == 404, where  # the stand-in's own 404
        else:
            assert not relayed, where
            code = "invalid_api_key" if reach == "none" else "admin_key_required"
            assert _refused(resp) == code, where
