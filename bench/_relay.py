"""A bare relay: the proxy's server and upstream client with none of its logic.

    python bench/_relay.py UPSTREAM_URL PORT BODY_FILE

Every POST /v1/chat/completions sends BODY_FILE's bytes (the decision read)
to UPSTREAM_URL through ``proxy.http1``, parses the JSON answer and replies
with a small JSON object. bench/overhead.py measures it beside the proxy: what
a hop through aiohttp and our client costs on this machine before any
decision logic runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.http1 import ConnectionPool  # noqa: E402

HEADERS = {"Content-Type": "application/json"}


def main() -> None:
    upstream, port, body = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]).read_bytes()
    pool = ConnectionPool(upstream, limit=64, keepalive_s=4.0, connect_timeout_s=3.0)

    async def decide(request: web.Request) -> web.Response:
        await request.read()
        answer = await pool.request("POST", "/v1/chat/completions", body, HEADERS, timeout_s=60)
        data = orjson.loads(answer.body)
        return web.Response(body=orjson.dumps({"model": data.get("model")}),
                            content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", decide)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, loop=uvloop.new_event_loop(),
                access_log=None, handler_cancellation=True, print=None)


if __name__ == "__main__":
    main()
