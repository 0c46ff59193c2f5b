"""An exception no handler expected: a JSON 500 in the route's API shape, with a request id
in the answer and in the log (never aiohttp's text 500). The app is real, its upstream fails."""

from __future__ import annotations

import logging

import pytest
from aiohttp.test_utils import TestClient, TestServer

from proxy.app import create_app
from proxy.config import Settings
from proxy.upstream import Upstream


class Broken(Upstream):
    async def is_router(self):
        return False  # one model, whose calls fail with bugs

    async def models_list(self):
        raise RuntimeError("a bug")

    async def model_info(self, facts=None):
        raise KeyError("another bug")


@pytest.fixture
async def client():
    settings = Settings(upstream_url="http://127.0.0.1:9")
    upstream = Broken(settings)
    async with TestClient(TestServer(create_app(settings, upstream=upstream))) as c:
        yield c
    await upstream.close()


@pytest.mark.parametrize(
    ("method", "path", "body", "shape"),
    [
        ("GET", "/v1/models", None, "error"),
        ("POST", "/v1/systemone", {"state": "x", "questions": {"q": {"type": "noul"}}}, "detail"),
        (
            "POST",
            "/v1/decisions",
            {
                "model": "jev-latest",
                "input": "x",
                "questions": [{"type": "predicate", "name": "q", "instructions": "Is it?"}],
            },
            "error",
        ),
    ],
)
async def test_a_bug_is_a_json_500_with_a_request_id(client, caplog, method, path, body, shape):
    with caplog.at_level(logging.ERROR, logger="proxy"):
        resp = await client.request(method, path, json=body)
    assert resp.status == 500 and resp.content_type == "application/json"
    request_id = resp.headers["X-Request-Id"]
    answer = await resp.json()
    assert list(answer) == [shape]
    text = answer["detail"] if shape == "detail" else answer["error"]["message"]
    assert text == f"the proxy failed to answer this request (request id {request_id})"
    (record,) = [r for r in caplog.records if request_id in r.getMessage()]
    assert record.exc_info is not None and "bug" in str(record.exc_info[1])
    metrics = await (await client.get("/metrics")).text()
    assert f'outcome="server_error",route="{path}"' in metrics


async def test_a_bug_in_a_jsonlines_line_is_its_500_record_the_same_way(monkeypatch, caplog):
    """One line of a jsonlines payload goes through the middleware's handler too."""
    from aiohttp import web

    from proxy.app_keys import METRICS
    from proxy.metrics import Metrics
    from proxy.routes import invocations

    async def broken(app, raw, context):
        raise RuntimeError("a bug")

    monkeypatch.setattr(invocations, "_answer", broken)
    app = web.Application()
    app[METRICS] = Metrics()
    with caplog.at_level(logging.ERROR, logger="proxy"):
        record = await invocations.answer_line(app, b'{"state": "x"}', None)
    request_id = record["error"]["message"].rpartition("request id ")[2].rstrip(")")
    assert len(request_id) == 16
    assert record == {
        "error": {
            "status": 500,
            "message": f"the proxy failed to answer this line (request id {request_id})",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    (logged,) = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged.exc_info is not None and "a bug" in str(logged.exc_info[1])
