"""Every path the proxy does not answer itself is llama-server's, relayed unchanged
(method, headers that matter, body, status, streaming), so a client pointed at the
proxy instead of llama-server loses nothing. One exception: the routes that
control the server are refused (403) unless the request carries the configured
admin key in ``X-Admin-Key``:

    POST /slots/{id}?action=erase|save|restore   erase or persist a slot's cache
    POST /props                                   change the server's properties

``GET /slots`` and ``GET /props`` only read and are relayed like everything else.

POST bodies to llama-server's chat and generation paths are read first
(``proxy/protocol/relayed.py``): chat bodies checked as OpenAI's shape, generations
bounded to ``--relay-max-tokens``; every other body goes through as its bytes.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from ..app_keys import SETTINGS, UPSTREAM
from ..errors import ProxyError
from ..protocol.relayed import CHAT_PATHS, GENERATIONS, relayed_body
from .common import json_object, relay, relayed_work

__all__ = ["relayed", "is_control"]


class AdminOnly(ProxyError):
    status = 403
    error_type = "permission_error"
    code = "admin_key_required"


def is_control(method: str, path: str) -> bool:
    """Whether a request changes llama-server's state rather than asking it something."""
    return method == "POST" and (path == "/props" or path == "/slots" or path.startswith("/slots/"))


async def relayed(request: web.Request) -> web.StreamResponse:
    control = is_control(request.method, request.path)
    if control:
        key = request.app[SETTINGS].admin_api_key
        given = request.headers.get("X-Admin-Key", "").encode("utf-8", "surrogateescape")
        if not key or not hmac.compare_digest(given, key.encode()):
            raise AdminOnly(
                f"{request.method} {request.path} controls llama-server: it needs "
                "the proxy's admin key in X-Admin-Key (PROXY_ADMIN_KEY)",
                param="X-Admin-Key",
            )
    body = await request.read() if request.body_exists else None
    path = request.path
    work = None
    if request.method == "POST" and (path in CHAT_PATHS or path in GENERATIONS):
        raw = body or b""
        parsed = json_object(raw)
        body = relayed_body(path, parsed, raw, request.app[SETTINGS].relay_max_tokens)
        work = relayed_work(request.app, path, parsed, body)
    return await relay(request, request.app[UPSTREAM], body, work=work, resend=not control)
