"""Bare relays: a hop to llama-server with none of the proxy's logic.

    python bench/_relay.py aiohttp|protocol UPSTREAM_URL PORT BODY_FILE

Every POST sends BODY_FILE's bytes (the decision read) to UPSTREAM_URL through
``proxy.http1``, parses the JSON answer and replies with a small JSON object.
``aiohttp`` serves through an aiohttp application, ``protocol`` through a bare
``asyncio.Protocol`` (the way proxy/front.py serves decisions); GET answers
``ok`` for the readiness check. bench/overhead.py measures both beside the
proxy: what a Python hop costs on this machine before any decision logic runs,
and what aiohttp's server adds to it.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.http1 import ConnectionPool  # noqa: E402

HEADERS = {"Content-Type": "application/json"}


async def answer(pool: ConnectionPool, body: bytes) -> bytes:
    reply = await pool.request("POST", "/v1/chat/completions", body, HEADERS, timeout_s=60)
    return orjson.dumps({"model": orjson.loads(reply.body).get("model")})


def serve_aiohttp(pool: ConnectionPool, body: bytes, port: int) -> None:
    async def decide(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=await answer(pool, body), content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", decide)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, loop=uvloop.new_event_loop(),
                access_log=None, handler_cancellation=True, print=None)


class _Hop(asyncio.Protocol):
    """HTTP/1.1 with Content-Length bodies only, one request at a time: enough for the bench."""

    def __init__(self, pool: ConnectionPool, body: bytes):
        self.pool, self.body, self.buffer = pool, body, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length:]
        asyncio.get_running_loop().create_task(self.reply(head.startswith(b"get")))

    async def reply(self, is_get: bool) -> None:
        out = b"ok" if is_get else await answer(self.pool, self.body)
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(out), out))


def serve_protocol(pool: ConnectionPool, body: bytes, port: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(lambda: _Hop(pool, body), "127.0.0.1", port)
        await asyncio.Event().wait()

    uvloop.run(main())


def main() -> None:
    server, upstream, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    body = Path(sys.argv[4]).read_bytes()
    pool = ConnectionPool(upstream, limit=64, keepalive_s=4.0, connect_timeout_s=3.0)
    {"aiohttp": serve_aiohttp, "protocol": serve_protocol}[server](pool, body, port)


if __name__ == "__main__":
    main()
