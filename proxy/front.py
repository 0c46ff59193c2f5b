"""The front door: plain decision requests answered without aiohttp's request machinery.

Every connection starts here. A request that is plainly a decision (HTTP/1.1
``POST`` to a decision path, framed by one ``Content-Length`` within the body
limit, a JSON object asking for one JSON answer) is answered here, through the
same route functions, authentication, error bodies and metrics as the aiohttp
application; ``front_http.py`` runs each connection's HTTP/1.1 cycle. Anything
else (pass-through and streams, other methods and paths, chunked or oversized
bodies, ``Expect``, HTTP/1.0, bad JSON, a missing or wrong key, a head the
parser does not like) hands the connection over to aiohttp, with every byte
received so far, for the rest of its life; nothing of it has been answered or
lost.

Why: on a 2-core machine a decision reads in ~12 ms, and every tenth of a
millisecond of hop shows. With decisions served here the proxy's latency ratio
at concurrency 1 went from 1.05-1.08 to 1.00-1.07 (bench/overhead.py; README).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from .app_keys import METRICS, SERVICE, SETTINGS
from .config import Settings
from .errors import InvalidRequest, ProxyError
from .front_http import Connection
from .metrics import after_reply, upstream_seconds
from .middleware import authenticate, render_error
from .protocol.chat import completion_body
from .protocol.systemone import parse_request as parse_system_one
from .routes.chat import chat_decision, is_fast_decision
from .routes.common import check_depth
from .routes.decisions import decisions_answer
from .routes.invocations import body_shape
from .routes.systemone import served_here, system_one_answer

__all__ = ["Server", "Front"]

log = logging.getLogger("proxy")

_KEEPALIVE_S = 75.0  # idle keep-alive connections are closed after this (aiohttp's default)
_OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"

# (api whose error shape answers the request, the coroutine that builds the JSON answer)
Plan = tuple[str, Callable[[], Awaitable[Any]]]


class Server:
    """The proxy listening on ``settings.host:port``: the front on the socket,
    aiohttp's server behind it for whatever the front hands over."""

    def __init__(self, app: web.Application, settings: Settings, *,
                 keepalive_s: float = _KEEPALIVE_S):
        self._app, self._settings, self._keepalive_s = app, settings, keepalive_s
        self._runner = web.AppRunner(
            app, handle_signals=False, access_log=None,
            handler_cancellation=True,  # a client that disconnects cancels its upstream call
            keepalive_timeout=keepalive_s, shutdown_timeout=settings.shutdown_timeout_s,
        )
        self._front: Front | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._closed = False

    async def start(self) -> None:
        await self._runner.setup()
        assert self._runner.server is not None
        self._front = Front(self._app, self._runner.server, keepalive_s=self._keepalive_s)
        self._listener = await asyncio.get_running_loop().create_server(
            self._front, self._settings.host, self._settings.port)

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Drain: no new connections, idle ones closed, requests in progress given
        ``shutdown_timeout_s`` to finish (then cancelled), the application cleaned up."""
        if self._closed:
            return
        self._closed = True
        timeout_s = self._settings.shutdown_timeout_s
        if self._listener is not None:
            self._listener.close()
        server = self._runner.server
        if server is not None and self._front is not None:
            server.pre_shutdown()
            await asyncio.gather(self._front.shutdown(timeout_s), server.shutdown(timeout_s))
        await self._runner.cleanup()


class Front:
    """The protocol factory for the listening socket. ``handoff`` makes aiohttp's
    protocol for a connection (``AppRunner.server``)."""

    def __init__(self, app: web.Application, handoff: Callable[[], asyncio.Protocol], *,
                 keepalive_s: float = _KEEPALIVE_S):
        self._app = app
        self.handoff = handoff
        self.keepalive_s = keepalive_s
        self._settings = app[SETTINGS]
        self.max_body_bytes = self._settings.max_body_bytes
        self._metrics = app[METRICS]
        self._service = app[SERVICE]
        self._routes: dict[bytes, Callable[[dict[str, Any], bytes], Plan | None]] = {
            b"/v1/chat/completions": self._chat,
            b"/v1/systemone": self._system_one,
            b"/v1/decisions": self._decisions,
            b"/invocations": self._invocations,
        }
        self.connections: set[Connection] = set()  # those still served here
        self.closing = False

    def __call__(self) -> Connection:
        return Connection(self)

    async def shutdown(self, timeout_s: float) -> None:
        """Close idle connections; give requests in progress ``timeout_s`` to finish
        (their connections close after the answer), then cancel the rest and close
        their connections unanswered."""
        self.closing = True
        busy = []
        for conn in list(self.connections):
            if conn.task is None:
                conn.close()
            else:
                busy.append(conn.task)
        if busy:
            _, late = await asyncio.wait(busy, timeout=timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for conn in list(self.connections):  # those cancelled, and any still arriving
            conn.close()

    # -- what is served here: the answer, or None to hand the request to aiohttp --

    def plan(self, path: bytes, raw: bytes) -> Plan | None:
        route = self._routes.get(path)
        if route is None:
            return None
        if path == b"/v1/chat/completions" and b'"semif"' not in raw:
            return None  # pass-through: parsed once, by aiohttp (an escaped key gets there too)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return route(body, raw) if isinstance(body, dict) else None

    def _chat(self, body: dict[str, Any], raw: bytes) -> Plan | None:
        if not is_fast_decision(body):
            return None

        async def answer() -> dict[str, Any]:
            outcome, model, _ = await chat_decision(self._app, body, raw)
            return completion_body(outcome, model)

        return "openai", answer

    def _system_one(self, body: dict[str, Any], raw: bytes) -> Plan | None:
        info = self._service.known_model()
        if not served_here(info):  # not known yet, or a decision model: relayed by aiohttp
            return None

        async def answer() -> dict[str, Any]:
            check_depth(body, raw)
            return await system_one_answer(self._app, parse_system_one(body), info)

        return "systemone", answer

    def _decisions(self, body: dict[str, Any], raw: bytes) -> Plan | None:
        return "openai", lambda: decisions_answer(self._app, body, raw)

    def _invocations(self, body: dict[str, Any], raw: bytes) -> Plan | None:
        try:
            shape = body_shape(body)
        except InvalidRequest:
            return None
        if shape == "chat":
            return self._chat(body, raw)
        return self._system_one(body, raw) if shape == "systemone" else self._decisions(body, raw)

    # -- serving ---------------------------------------------------------------

    def authorized(self, header: str) -> bool:
        """Whether the ``Authorization`` header passes; the front serves only requests
        that do (aiohttp answers the rest with its 401, body unread)."""
        try:
            authenticate(self._settings, header)
        except ProxyError:
            return False
        return True

    async def serve(self, conn: Connection, path: bytes, plan: Plan) -> None:
        """What the middleware does around a handler: metrics, and errors in the
        API's own shape (authentication was checked on the head)."""
        route = path.decode()
        api, answer = plan
        metrics = self._metrics
        metrics.request_started(route)
        upstream = upstream_seconds()
        started = time.perf_counter()
        status = 499  # the client went away before an answer
        try:
            try:
                payload = orjson.dumps(await answer())
                status = 200
                conn.reply(_OK_HEAD, payload)
            except ProxyError as err:
                status = self._error(conn, route, api, err)
            except Exception:
                log.exception("POST %s failed", route)
                status = self._error(conn, route, api, ProxyError("the proxy failed to answer"))
        finally:
            after_reply(metrics.request_finished, route, "decision", status,
                        time.perf_counter() - started, upstream.seconds)

    def _error(self, conn: Connection, route: str, api: str, err: ProxyError) -> int:
        response = render_error(self._app, "POST", route, api, err)
        head = [b"HTTP/1.1 %d %s\r\n" % (response.status, response.reason.encode())]
        head += [f"{name}: {value}\r\n".encode("latin-1")
                 for name, value in response.headers.items() if name.lower() != "content-length"]
        assert isinstance(response.body, bytes)
        conn.reply(b"".join(head), response.body)
        return response.status
