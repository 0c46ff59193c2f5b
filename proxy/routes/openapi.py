"""GET /openapi.json: the OpenAPI document of every route (built in ``proxy/openapi.py``)."""

from __future__ import annotations

from functools import cache

import orjson
from aiohttp import web

from ..openapi import openapi_document

__all__ = ["openapi"]


@cache
def _body() -> bytes:
    return orjson.dumps(openapi_document())


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=_body(), content_type="application/json")
