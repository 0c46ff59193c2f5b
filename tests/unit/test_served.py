"""Which model a request is for (proxy/served.py), with a router's recorded /v1/models
answer, and what the upstream client sends for a router's model (proxy/upstream.py)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config import Settings
from proxy.errors import ProxyError
from proxy.served import ServedModels, UnknownModel
from proxy.upstream import ModelInfo, ModelList, Upstream, parse_models

ROUTER_MODELS = {
    "object": "list",
    "data": [
        {"id": "qwen3-4b", "aliases": ["qwen"], "status": {"value": "unloaded"}},
        {"id": "smollm2", "aliases": [], "status": {"value": "loaded"}},
    ],
}


class Recorded:
    """An upstream that answers from recordings: a router listing ``models``."""

    def __init__(self, router: bool, models: dict):
        self.router, self.models, self.lists, self.model = router, models, 0, None

    async def is_router(self) -> bool:
        return self.router

    async def models_list(self) -> ModelList:
        self.lists += 1
        return parse_models(self.models)

    def for_model(self, name: str) -> Recorded:
        bound = Recorded(self.router, self.models)
        bound.model = name
        return bound


class Discovered:
    """A stand-in ``Discovery``: the one model served."""

    async def model(self, facts=None) -> ModelInfo:
        return ModelInfo("SmolLM2-135M-Instruct.Q4_1", None, None, ("smol",))


class Service:
    """A stand-in decision service: the upstream it was made for (``upstream.model``: the
    router's model it reads) and what that serves."""

    def __init__(self, upstream: Recorded):
        self.upstream = upstream
        self.discovery = Discovered()


def served(router: bool = True, **kwargs) -> tuple[ServedModels, Recorded]:
    upstream = Recorded(router, ROUTER_MODELS)
    return ServedModels(upstream, Service, **kwargs), upstream


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("qwen3-4b", "qwen3-4b"),
        ("qwen", "qwen3-4b"),
        ("smollm2", "smollm2"),
        # names every API has a default for, and none: the first listed
        (None, "qwen3-4b"),
        ("jev-latest", "qwen3-4b"),
        ("gpt-6-luna", "qwen3-4b"),
    ],
)
async def test_a_router_routes_by_id_alias_or_default(name, model):
    models, _ = served()
    assert (await models.service(name)).upstream.model == model
    assert models.several


async def test_one_service_per_model_and_the_default_is_configurable():
    models, upstream = served(default_model="smollm2", aliases="house-model")
    first = await models.service("smollm2")
    assert await models.service("smollm2") is first
    assert await models.service(None) is first and await models.service("house-model") is first
    assert (await models.service("qwen")).upstream.model == "qwen3-4b"
    assert upstream.lists == 1  # the list is asked once while every name is known


async def test_an_unknown_name_asks_the_list_again_then_names_the_models():
    models, upstream = served()
    await models.service(None)
    with pytest.raises(UnknownModel) as err:
        await models.service("gpt-4o")
    assert upstream.lists == 2  # the router's list may have grown since
    assert err.value.names == ("jev-latest", "gpt-6-luna", "qwen3-4b", "qwen", "smollm2")
    assert err.value.message() == (
        "unknown model 'gpt-4o'; this server answers as "
        "['jev-latest', 'gpt-6-luna', 'qwen3-4b', 'qwen', 'smollm2']"
    )


async def test_a_default_model_the_router_does_not_list_is_the_servers_error():
    models, _ = served(default_model="llama-70b")
    for name in (None, "jev-latest"):  # not the client's fault: a 500 naming the setting
        with pytest.raises(ProxyError) as err:
            await models.service(name)
        assert err.value.status == 500 and "PROXY_DEFAULT_MODEL" in err.value.message


async def test_one_model_answers_its_names_and_chat_takes_any():
    models, _ = served(router=False)
    single = await models.service(None)
    assert single.upstream.model is None and not models.several  # nothing named upstream
    for name in ("jev-latest", "gpt-6-luna", "SmolLM2-135M-Instruct.Q4_1", "smol"):
        assert await models.service(name) is single
    with pytest.raises(UnknownModel):
        await models.service("gpt-4o")
    assert await models.service("gpt-4o", strict=False) is single


def test_only_the_default_model_answers_to_the_sdk_names():
    models, _ = served()
    info = ModelInfo("smollm2", None, None, ("small",))
    assert models.names_of(info, default=False).listed == ("smollm2", "small")
    assert models.names_of(info, default=True).listed[:2] == ("jev-latest", "gpt-6-luna")


async def test_a_routers_model_is_named_in_every_call():
    seen = []

    async def record(request: web.Request) -> web.Response:
        body = await request.json() if request.method == "POST" else None
        seen.append((request.method, request.path_qs, body))
        if request.path == "/tokenize":
            return web.json_response({"tokens": [1, 2]})
        if request.path == "/props":
            return web.json_response(
                {"total_slots": 2, "default_generation_settings": {"n_ctx": 8192}}
            )
        return web.json_response(ROUTER_MODELS)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    async with TestServer(app) as server:
        root = Upstream(Settings(upstream_url=str(server.make_url(""))))
        bound = root.for_model("qwen3-4b")
        try:
            assert await bound.tokenize("hi") == [1, 2]
            assert await bound.total_slots() == 2
            info = await bound.model_info()
            await root.tokenize("hi")
        finally:
            await root.close()
    assert seen[0] == (
        "POST",
        "/tokenize",
        {"content": "hi", "add_special": False, "model": "qwen3-4b"},
    )
    assert seen[1][:2] == ("GET", "/props?model=qwen3-4b")
    assert seen[2][:2] == ("GET", "/v1/models")  # the router's own list: not routed
    assert info.id == "qwen3-4b"  # the bound model's entry, not the first
    assert info.n_ctx == 8192  # from /props: the router's list has no meta before loading
    assert seen[-1][2] == {"content": "hi", "add_special": False}  # the root names none
    assert root.model is None


def test_a_relay_to_a_router_names_the_resolved_model():
    import orjson

    from proxy.routes.common import routed

    class Bound:
        upstream = SimpleNamespace(model="qwen3-4b")

    class Single:
        upstream = SimpleNamespace(model=None)

    raw = b'{"model": "jev-latest", "query": "q"}'
    body = orjson.loads(raw)
    assert orjson.loads(routed(raw, body, Bound())) == {"model": "qwen3-4b", "query": "q"}
    assert routed(raw, body, Single()) is raw  # one model: the bytes as they came
    same = b'{"model": "qwen3-4b"}'
    assert routed(same, orjson.loads(same), Bound()) is same


@contextlib.asynccontextmanager
async def answering(method: str, path: str, status: int):
    """An Upstream whose llama-server answers ``method path`` with ``status`` and ``{}``."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({}, status=status)

    app = web.Application()
    app.router.add_route(method, path, handler)
    async with TestServer(app) as server:
        upstream = Upstream(Settings(upstream_url=str(server.make_url("")).rstrip("/")))
        try:
            yield upstream
        finally:
            await upstream.close()


@pytest.mark.parametrize(("status", "router"), [(500, False), (404, False), (401, False)])
async def test_a_props_that_fails_means_one_model(status, router):
    async with answering("GET", "/props", status) as upstream:
        assert await upstream.is_router() is router


@pytest.mark.parametrize(
    ("status", "found"), [(200, True), (501, False), (404, False), (500, None), (400, None)]
)
async def test_only_a_clear_answer_says_whether_llama_server_reranks(status, found):
    async with answering("POST", "/v1/rerank", status) as upstream:
        assert await upstream.reranks() is found
