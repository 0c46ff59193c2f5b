"""Every route's errors have one shape, rendered in one place (errors.py, through the
middleware): OpenAI's ``{"error": {message, type, param, code}}`` everywhere but System One,
which answers FastAPI's ``{"detail": [{loc, msg, type}]}`` for validation (422) and
``{"detail": <message>}`` otherwise. The app is real; its llama-server is not there."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.config import Settings

OPENAI_KEYS = ["message", "type", "param", "code"]
KEY = "k" * 20
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
SYSTEM_ONE = {"state": "x", "questions": {"q": {"type": "noul"}}}

# (method, path, body, status): one refusal or failure per route
OPENAI_ROUTES: list[tuple[str, str, Any, int]] = [
    ("POST", "/v1/chat/completions", {**CHAT, "semif": {"type": "bogus"}}, 400),
    ("POST", "/v1/chat/completions", {**CHAT, "semif": {"options": ["a", "b"]}, "n": 2}, 400),
    ("POST", "/v1/chat/completions", CHAT, 503),  # relayed: llama-server is not there
    ("POST", "/v1/decisions", {"input": "x", "questions": []}, 400),
    ("POST", "/v1/rerank", {"query": "q", "documents": ["a"]}, 503),
    ("POST", "/invocations", {"neither": "shape"}, 400),
    ("POST", "/v1/completions", {"prompt": "hi"}, 503),
    ("GET", "/v1/models", None, 503),
    ("GET", "/v1/models/nothing", None, 503),
    ("GET", "/health", None, 503),
    ("GET", "/no-such-route", None, 403),  # on neither list: needs the admin key
]


@pytest.fixture
async def client():
    settings = Settings(upstream_url="http://127.0.0.1:9", admin_api_key=KEY)
    async with TestClient(TestServer(create_app(settings))) as c:
        yield c


def _openai_shaped(body: Any) -> None:
    assert list(body) == ["error"]
    assert list(body["error"]) == OPENAI_KEYS
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["type"], str) and isinstance(body["error"]["code"], str)


@pytest.mark.parametrize(("method", "path", "body", "status"), OPENAI_ROUTES)
async def test_openai_routes_answer_openais_error_shape(client, method, path, body, status):
    resp = await client.request(method, path, json=body)
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    _openai_shaped(await resp.json())


async def test_system_one_answers_its_validation_shape(client):
    resp = await client.post("/v1/systemone", json={"state": "x", "questions": {}})
    assert resp.status == 422
    body = await resp.json()
    assert list(body) == ["detail"]
    assert [list(entry) for entry in body["detail"]] == [["loc", "msg", "type"]]


async def test_system_one_answers_other_errors_as_a_detail_message(client):
    resp = await client.post("/v1/systemone", json=SYSTEM_ONE)
    assert resp.status == 503
    body = await resp.json()
    assert list(body) == ["detail"] and isinstance(body["detail"], str)


@pytest.mark.parametrize(
    ("method", "path", "shape"),
    [
        ("POST", "/v1/chat/completions", "error"),
        ("POST", "/v1/decisions", "error"),
        ("POST", "/invocations", "error"),
        ("GET", "/v1/models", "error"),
        ("POST", "/v1/systemone", "detail"),
    ],
)
async def test_a_missing_key_is_refused_in_the_routes_shape(method, path, shape):
    settings = Settings(upstream_url="http://127.0.0.1:9", api_key=KEY)
    async with TestClient(TestServer(create_app(settings))) as c:
        resp = await c.request(method, path, json={})
        assert resp.status == 401
        body = await resp.json()
    if shape == "error":
        _openai_shaped(body)
    else:
        assert list(body) == ["detail"] and isinstance(body["detail"], str)
