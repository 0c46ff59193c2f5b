"""A bare relay: a hop to llama-server with none of the proxy's logic.

    python bench/_relay.py UPSTREAM_URL PORT BODY_FILE [UPSTREAM_PATH]

Every POST sends BODY_FILE's bytes (the decision read) to UPSTREAM_URL's
UPSTREAM_PATH (default /completion, the proxy's read) with an
aiohttp client tuned as the proxy's is (pooled keep-alive, no cookie jar),
parses the JSON answer and replies with a small JSON object from an aiohttp
application on uvloop; GET answers ``ok`` for the readiness check.
bench/overhead.py measures it beside the proxy: what a Python hop costs on this
machine before any decision logic runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import orjson
import uvloop
from aiohttp import web

HEADERS = {"Content-Type": "application/json"}
SESSION = web.AppKey("session", aiohttp.ClientSession)


def build(upstream: str, body: bytes, path: str = "/completion") -> web.Application:
    async def session_ctx(app: web.Application):
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=4.0),
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",),
        ) as session:
            app[SESSION] = session
            yield

    async def decide(request: web.Request) -> web.Response:
        await request.read()
        async with request.app[SESSION].post(upstream + path, data=body, headers=HEADERS) as resp:
            reply = orjson.loads(await resp.read())
        return web.Response(
            body=orjson.dumps({"model": reply.get("model")}), content_type="application/json"
        )

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/chat/completions", decide)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    upstream, port = sys.argv[1].rstrip("/"), int(sys.argv[2])
    body = Path(sys.argv[3]).read_bytes()
    path = sys.argv[4] if len(sys.argv) > 4 else "/completion"
    web.run_app(
        build(upstream, body, path),
        host="127.0.0.1",
        port=port,
        loop=uvloop.new_event_loop(),
        access_log=None,
        handler_cancellation=True,
        print=None,
    )


if __name__ == "__main__":
    main()
