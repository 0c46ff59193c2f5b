"""Health and model listing."""

from __future__ import annotations

from aiohttp import web

from ..app_keys import UPSTREAM
from .common import json_response, relay

__all__ = ["health", "models"]


async def health(request: web.Request) -> web.Response:
    """200 when llama-server is ready to answer, 503 otherwise (the proxy itself is up)."""
    ready = await request.app[UPSTREAM].health()
    return json_response({"status": "ok" if ready else "upstream unavailable"}, 200 if ready else 503)


async def models(request: web.Request) -> web.StreamResponse:
    return await relay(request, request.app[UPSTREAM], None)
