"""A llama-server started with --reranking (a real reranker GGUF; it answers rerank
itself and cannot chat) gets rerank requests forwarded untouched, found out once; a chat
model's 501 keeps them here. The upstream is a recorded llama-server."""

from __future__ import annotations

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.config import Settings

# llama-server b11434's answer to a Jina-style rerank on a --reranking model
RANKED = {
    "model": "bge-reranker-v2-m3",
    "object": "list",
    "usage": {"prompt_tokens": 24, "total_tokens": 24},
    "results": [{"index": 1, "relevance_score": 3.2}, {"index": 0, "relevance_score": -1.5}],
}
NOT_SUPPORTED = {
    "error": {
        "code": 501,
        "type": "not_supported_error",
        "message": "This server does not support reranking. Start it with `--reranking`",
    }
}


def recorded(reranker: bool, seen: list):
    async def rerank(request: web.Request) -> web.Response:
        seen.append((request.path, await request.read()))
        if not reranker:
            return web.json_response(NOT_SUPPORTED, status=501)
        return web.json_response(RANKED)

    async def props(request: web.Request) -> web.Response:
        return web.json_response({"total_slots": 1})

    app = web.Application()
    for path in ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking"):
        app.router.add_post(path, rerank)
    app.router.add_get("/props", props)
    return app


async def test_a_reranker_answers_itself_and_is_asked_once():
    seen: list = []
    async with TestServer(recorded(True, seen)) as upstream:
        settings = Settings(upstream_url=str(upstream.make_url("")).rstrip("/"))
        async with TestClient(TestServer(create_app(settings))) as client:
            tei = orjson.dumps({"query": "q", "texts": ["a", "b"], "raw_scores": True})
            for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
                resp = await client.post(
                    path, data=tei, headers={"Content-Type": "application/json"}
                )
                assert resp.status == 200 and await resp.json() == RANKED
    probe, *forwarded = seen
    assert orjson.loads(probe[1]) == {"query": "q", "documents": ["d"]}  # the one probe
    # untouched, to llama-server's path (Cohere's /v2/rerank to /v1/rerank)
    assert forwarded == [("/v1/rerank", tei), ("/rerank", tei), ("/v1/rerank", tei)]


async def test_a_chat_models_501_keeps_rerank_here():
    seen: list = []
    async with TestServer(recorded(False, seen)) as upstream:
        settings = Settings(upstream_url=str(upstream.make_url("")).rstrip("/"))
        async with TestClient(TestServer(create_app(settings))) as client:
            # validated here: TEI's "texts" is not this API's shape
            resp = await client.post("/v1/rerank", json={"query": "q", "texts": ["a"]})
            error = (await resp.json())["error"]
            again = await client.post("/v1/rerank", json={"query": "", "documents": ["a"]})
    assert resp.status == 400 and error["param"] == "documents"
    assert again.status == 400
    assert len(seen) == 1  # asked once, then remembered


async def test_a_rule_the_model_alone_declares_is_the_documents_and_the_routes():
    """A blank query and a ``top_n`` of true are refused by ``RerankRequest`` alone (no hand
    check is left): the published schema says so, and the route answers the model's
    refusal, naming the field."""
    from proxy.openapi import openapi_document
    from proxy.protocol.wire import NOT_BLANK

    request = openapi_document()["components"]["schemas"]["RerankRequest"]["properties"]
    assert request["query"]["pattern"] == NOT_BLANK
    assert request["top_n"]["anyOf"][0] == {"minimum": 1, "type": "integer"}
    seen: list = []
    async with TestServer(recorded(False, seen)) as upstream:
        settings = Settings(upstream_url=str(upstream.make_url("")).rstrip("/"))
        async with TestClient(TestServer(create_app(settings))) as client:
            blank = await client.post("/v1/rerank", json={"query": " \t", "documents": ["a"]})
            blank_error = (await blank.json())["error"]
            top = await client.post(
                "/v1/rerank", json={"query": "q", "documents": ["a"], "top_n": True}
            )
            top_error = (await top.json())["error"]
    assert blank.status == 400 and blank_error["param"] == "query"
    assert blank_error["message"] == "query: must not be empty"
    assert top.status == 400 and top_error["param"] == "top_n"
