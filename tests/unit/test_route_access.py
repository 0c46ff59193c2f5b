"""The lists of llama-server routes a client key and the admin key may reach
(``proxy/routes/access.py``), against every route of the pinned build
(``scripts/llama_routes.txt``, extracted from its source by ``scripts/llama_routes.py``)."""

from __future__ import annotations

import pytest

from proxy.routes.access import ADMIN, CLIENT, needs_admin, rule_for
from scripts import llama_routes, routes_doc

PINNED = llama_routes.read()
OURS = routes_doc.answered_here(PINNED)


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/props", "admin"),
        ("GET", "/props", "client"),
        ("HEAD", "/props", "client"),  # HEAD as GET
        ("POST", "/slots/0", "admin"),
        ("POST", "/slots/0/extra", None),  # :id_slot is one segment
        ("POST", "/slots", None),
        ("GET", "/slots", "client"),
        ("POST", "/lora-adapters", "admin"),
        ("GET", "/lora-adapters", "client"),
        ("POST", "/models/load", "admin"),
        ("GET", "/models/sse", "admin"),
        ("DELETE", "/models", "admin"),
        ("GET", "/cors-proxy", "admin"),
        ("POST", "/tools", "admin"),
        ("POST", "/predict", "admin"),
        ("POST", "/made-up-control", None),
        ("PUT", "/props", None),
        ("GET", "/", "client"),
        ("GET", "/_app/immutable/entry/start.abc123.js", "client"),  # the web UI's files
        ("GET", "/recommended-mcp/github-dark.png", "client"),
        ("POST", "/sw.js", None),
        ("GET", "/_app/../cors-proxy", None),  # httpx would send it as /cors-proxy
        ("GET", "/_app/./x.js", None),
        ("GET", "//cors-proxy.js", None),
        ("GET", "/a.b/cors-proxy", None),
        ("GET", "", None),
        ("OPTIONS", "/slots/0", "client"),  # a preflight runs no route
        ("POST", "/v1/chat/completions/control", "client"),
        ("DELETE", "/v1/stream", "client"),
        ("POST", "/v1/streams/lookup", "client"),
        ("POST", "/v1/messages/count_tokens", "client"),
    ],
)
def test_a_request_finds_its_list(method, path, expected):
    found = rule_for(method, path)
    got = None if found is None else ("admin" if found[0] else "client")
    assert got == expected
    assert needs_admin(method, path) == (expected != "client")


def test_every_route_of_the_pinned_build_is_on_a_list_or_the_proxys_own():
    unlisted = [
        f"{method} {path}"
        for method, path in PINNED
        if (method, path) not in OURS and rule_for(method, routes_doc.example(path)) is None
    ]
    assert not unlisted, f"on neither list in proxy/routes/access.py: {unlisted}"


def test_the_proxys_own_answers_are_the_ones_the_issue_names_and_on_no_list():
    assert set(OURS) == {
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
    listed = {(r.method, r.path) for r in (*CLIENT, *ADMIN)}
    assert not listed & set(OURS)


def test_every_listed_route_is_one_of_the_pinned_build_or_one_of_our_patterns():
    pinned = set(PINNED)
    stale = [
        f"{r.method} {r.path}"
        for r in (*CLIENT, *ADMIN)
        if (r.method, r.path) not in pinned and r.path not in ("{file}", "{any}")
    ]
    assert not stale, f"not a route of the pinned build: {stale}"
    listed = [(r.method, r.path) for r in (*CLIENT, *ADMIN)]
    assert len(listed) == len(set(listed))


SERVER_CPP = """
    if (is_router_server) {
        ctx_http.post("/models/load",          ex_wrapper(models_routes->load));
        ctx_http.del ("/models",               ex_wrapper(models_routes->del));
    }
    ctx_http.get ("/props",                    ex_wrapper(routes.get_props));
    // ctx_http.get (params.x, ...) is no literal path
    ctx_http.get (params.x,                    ex_wrapper(routes.get_props));
    ctx_http.post("/slots/:id_slot",           ex_wrapper(routes.post_slots));
    if (params.ui_mcp_proxy) {
        ctx_http.get ("/cors-proxy",      ex_wrapper(proxy_handler_get));
    } else {
        ctx_http.get ("/cors-proxy",      ex_wrapper(res_403));
    }
"""
SERVER_HTTP_CPP = """
        path_predict = getenv("AIP_PREDICT_ROUTE", "/predict", true);
            srv->Get(params.api_prefix + "/",           serve_asset_cached("index.html"));
                    srv->Get(params.api_prefix + "/" + a.name, serve_asset_nocache(a.name));
        srv->Get(params.api_prefix + "/sw.js", [](const httplib::Request &) {
        srv->Get(full_path, callback);
"""


def test_the_extraction_reads_every_literal_route_once():
    assert llama_routes.extract(SERVER_CPP, SERVER_HTTP_CPP) == [
        ("POST", "/models/load"),
        ("DELETE", "/models"),
        ("GET", "/props"),
        ("POST", "/slots/:id_slot"),
        ("GET", "/cors-proxy"),
        ("GET", "/"),
        ("GET", "/sw.js"),
        ("POST", "/predict"),
    ]


def test_the_committed_routes_are_the_pinned_sources():
    where = llama_routes.server_dir()
    if where is None:
        pytest.skip("the pinned llama.cpp source is not unpacked (make prepare)")
    extracted = llama_routes.extract(
        (where / "server.cpp").read_text(), (where / "server-http.cpp").read_text()
    )
    assert extracted == PINNED, "scripts/llama_routes.txt is stale: run scripts/llama_routes.py"
