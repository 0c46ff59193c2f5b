"""Every path the proxy does not answer itself is llama-server's, relayed unchanged
(method, headers that matter, body, status, streaming), so a client pointed at the
proxy instead of llama-server loses nothing it may use. What a client may reach is an
allow-list (``routes/access.py``): the routes that change llama-server for every later
request (``POST /props``, ``/slots/{id}``, ``/lora-adapters``, router mode's model
routes, ...) and every route on neither list are refused (403) unless the request
carries the configured admin key in ``X-Admin-Key``, and refused to everyone when no
admin key is configured.

POST bodies to llama-server's chat and generation paths are read first
(``proxy/protocol/relayed.py``): chat bodies checked as OpenAI's shape, generations
bounded to ``--relay-max-tokens``; every other body goes through as its bytes.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from ..app_keys import SETTINGS, UPSTREAM
from ..errors import AdminOnly
from ..protocol.relayed import CHAT_PATHS, GENERATIONS, relayed_body
from .access import rule_for
from .common import json_object, relay, relayed_work

__all__ = ["relayed"]


def _check_admin(request: web.Request) -> bool:
    """Whether the request needs the admin key; raises ``AdminOnly`` when it needs it and
    lacks it (always, when ``PROXY_ADMIN_KEY`` is unset)."""
    found = rule_for(request.method, request.path)
    if found is not None and not found[0]:
        return False
    key = request.app[SETTINGS].admin_api_key
    given = request.headers.get("X-Admin-Key", "").encode("utf-8", "surrogateescape")
    if not key or not hmac.compare_digest(given, key.encode()):
        what = found[1].why if found else "not a llama-server route clients may call here"
        unset = "" if key else "; no admin key is configured here, so it is refused to all"
        raise AdminOnly(
            f"{request.method} {request.path} ({what}) needs the proxy's admin key in "
            f"X-Admin-Key (PROXY_ADMIN_KEY){unset}",
            param="X-Admin-Key",
        )
    return True


async def relayed(request: web.Request) -> web.StreamResponse:
    admin = _check_admin(request)
    body = await request.read() if request.body_exists else None
    path = request.path
    work = None
    if request.method == "POST" and (path in CHAT_PATHS or path in GENERATIONS):
        raw = body or b""
        parsed = json_object(raw)
        body = relayed_body(path, parsed, raw, request.app[SETTINGS].relay_max_tokens)
        work = relayed_work(request.app, path, parsed, body)
    return await relay(request, request.app[UPSTREAM], body, work=work, resend=not admin)
