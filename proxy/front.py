"""The front door: plain decision requests answered without aiohttp's request machinery.

Every connection starts here. A request that is plainly a decision (HTTP/1.1
``POST`` to a decision path, framed by one ``Content-Length`` within the body
limit, a JSON object asking for one JSON answer) is answered on this protocol,
through the same route functions, authentication, error bodies and metrics as
the aiohttp application. Anything else (pass-through and streams, other
methods and paths, chunked or oversized bodies, ``Expect``, HTTP/1.0, bad JSON,
a missing or wrong key, a head this parser does not like) hands the connection
over to aiohttp, with every byte received so far, for the rest of its life;
nothing of it has been answered or lost.

Why: on a 2-core machine a decision reads in ~12 ms, and every tenth of a
millisecond of hop shows. With decisions served here the proxy's latency ratio
at concurrency 1 went from 1.05-1.08 to 1.00-1.07 (bench/overhead.py; README).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any

import orjson
from aiohttp import web

from .app_keys import METRICS, SERVICE, SETTINGS
from .config import Settings
from .errors import InvalidRequest, ProxyError
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

_MAX_HEAD = 8190  # longer heads go to aiohttp, whose limits decide
_KEEPALIVE_S = 75.0  # idle keep-alive connections are closed after this (aiohttp's default)
# A head may hold tabs, CRLFs and any byte from space up, except DEL; a header's
# name only these (RFC 9110 "token"). Deleting them must leave nothing.
_HEAD_BYTES = b"\t\r\n" + bytes(range(0x20, 0x7F)) + bytes(range(0x80, 0x100))
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
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
        self._handoff = handoff
        self.keepalive_s = keepalive_s
        self._settings = app[SETTINGS]
        self._metrics = app[METRICS]
        self._service = app[SERVICE]
        self._routes: dict[bytes, Callable[[dict[str, Any], bytes], Plan | None]] = {
            b"/v1/chat/completions": self._chat,
            b"/v1/systemone": self._system_one,
            b"/v1/decisions": self._decisions,
            b"/invocations": self._invocations,
        }
        self._connections: set[_Connection] = set()
        self.closing = False

    def __call__(self) -> _Connection:
        return _Connection(self)

    async def shutdown(self, timeout_s: float) -> None:
        """Close idle connections; give requests in progress ``timeout_s`` to finish
        (their connections close after the answer), then cancel the rest and close
        their connections unanswered."""
        self.closing = True
        busy = []
        for conn in list(self._connections):
            if conn.task is None:
                conn.close()
            else:
                busy.append(conn.task)
        if busy:
            _, late = await asyncio.wait(busy, timeout=timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for conn in list(self._connections):  # those cancelled, and any still arriving
            conn.close()

    # -- what is served here: the answer, or None to hand the request to aiohttp --

    def plan(self, path: bytes, body: dict[str, Any], raw: bytes) -> Plan | None:
        route = self._routes.get(path)
        return route(body, raw) if route is not None else None

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

    async def serve(self, conn: _Connection, path: bytes, plan: Plan) -> None:
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

    def _error(self, conn: _Connection, route: str, api: str, err: ProxyError) -> int:
        response = render_error(self._app, "POST", route, api, err)
        head = [b"HTTP/1.1 %d %s\r\n" % (response.status, response.reason.encode())]
        head += [f"{name}: {value}\r\n".encode("latin-1")
                 for name, value in response.headers.items() if name.lower() != "content-length"]
        assert isinstance(response.body, bytes)
        conn.reply(b"".join(head), response.body)
        return response.status


class _Connection(asyncio.Protocol):
    """One client connection, until it closes or is handed to aiohttp."""

    def __init__(self, front: Front):
        self._front = front
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._head: tuple[int, bytes, int, bool] | None = None  # parsed, body pending
        self._keep_alive = True
        self._paused = False  # reading paused: too much pipelined behind a request
        self._write_paused = False  # the client is not reading its answers
        self._idle: asyncio.TimerHandle | None = None
        self._idle_since = 0.0  # last answer or last byte received, whichever is later
        self.task: asyncio.Task[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self._front._connections.add(self)
        self._wait_idle()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self.task is None:
            self._idle_since = asyncio.get_running_loop().time()  # a slow body is not idle
            if not self._write_paused:
                self._next()
        elif len(self._buffer) > self._front._settings.max_body_bytes + _MAX_HEAD:
            assert self._transport is not None
            self._transport.pause_reading()  # pipelined past what one request may hold
            self._paused = True

    def pause_writing(self) -> None:
        self._write_paused = True  # no further pipelined request until the client reads

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.task is None and self._buffer and self._transport is not None:
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self._front._connections.discard(self)
        self._transport = None
        if self._idle is not None:
            self._idle.cancel()
        if self.task is not None:
            self.task.cancel()  # the client is gone: so is its upstream call

    # the request cycle

    def _next(self) -> None:
        """Serve the buffered request once it is complete, or hand the connection over."""
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n", 0, _MAX_HEAD + 4)
            if end < 0:
                if len(self._buffer) > _MAX_HEAD:
                    self._hand_off()
                return
            head = _parse_head(bytes(self._buffer[:end]))
            if (head is None or head[1] > self._front._settings.max_body_bytes
                    or not self._front.authorized(head[3])):
                self._hand_off()
                return
            self._head = (end + 4, *head[:3])
        start, path, length, keep_alive = self._head
        if len(self._buffer) < start + length:
            return  # the body is still arriving
        raw = bytes(self._buffer[start:start + length])
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        plan = self._front.plan(path, body, raw) if isinstance(body, dict) else None
        if plan is None:
            self._hand_off()
            return
        del self._buffer[:start + length]
        self._head = None
        self._keep_alive = keep_alive and not self._front.closing
        self.task = asyncio.get_running_loop().create_task(self._serve(path, plan))

    async def _serve(self, path: bytes, plan: Plan) -> None:
        await self._front.serve(self, path, plan)
        self.task = None
        if self._transport is None or self._transport.is_closing():
            return
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        self._wait_idle()
        if self._buffer and not self._write_paused:
            self._next()  # pipelined

    def reply(self, head: bytes, body: bytes) -> None:
        """Write one answer: ``head`` is the status line and headers, less framing."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        keep_alive = self._keep_alive and not self._front.closing
        transport.write(b"".join((
            head, b"Content-Length: %d\r\nDate: %s\r\n" % (len(body), _http_date()),
            b"\r\n" if keep_alive else b"Connection: close\r\n\r\n", body,
        )))
        if not keep_alive:
            transport.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _wait_idle(self) -> None:
        """Close the connection once it has been idle for ``keepalive_s``: one timer per
        connection, re-armed only when it fires (not rescheduled per request)."""
        loop = asyncio.get_running_loop()
        self._idle_since = loop.time()
        if self._idle is None:
            self._idle = loop.call_at(self._idle_since + self._front.keepalive_s, self._close_if_idle)

    def _close_if_idle(self) -> None:
        self._idle = None
        if self.task is not None:
            return  # busy: re-armed once the answer is written
        due = self._idle_since + self._front.keepalive_s
        loop = asyncio.get_running_loop()
        if loop.time() >= due:
            self.close()
        else:
            self._idle = loop.call_at(due, self._close_if_idle)

    def _hand_off(self) -> None:
        """Give the connection, and every byte not yet answered, to aiohttp."""
        transport, data = self._transport, bytes(self._buffer)
        assert transport is not None
        self.connection_lost(None)
        protocol = self._front._handoff()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if data:
            protocol.data_received(data)


def _parse_head(head: bytes) -> tuple[bytes, int, bool, str] | None:
    """(path, Content-Length, keep-alive, Authorization) of a request this front
    serves; ``None`` for anything else (aiohttp answers those)."""
    lines = head.split(b"\r\n")
    breaks = len(lines) - 1
    if head.translate(None, _HEAD_BYTES) or head.count(b"\n") != breaks or head.count(b"\r") != breaks:
        return None  # control bytes, or a bare CR or LF
    parts = lines[0].split(b" ")
    if (len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1"
            or not parts[1].startswith(b"/")):
        return None
    length: int | None = None
    keep_alive, auth, hosts = True, None, 0
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name.translate(None, _TOKEN):
            return None
        name, value = name.lower(), value.strip(b" \t")
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif name == b"connection":
            tokens = {t.strip().lower() for t in value.split(b",")}
            if b"upgrade" in tokens:
                return None
            keep_alive = keep_alive and b"close" not in tokens
        elif name in (b"transfer-encoding", b"expect", b"upgrade"):
            return None
        elif name == b"host":
            hosts += 1
        elif name == b"authorization" and auth is None:
            auth = value.decode("utf-8", "surrogateescape")
    if length is None or hosts != 1:  # HTTP/1.1 asks for exactly one Host
        return None
    return parts[1], length, keep_alive, auth or ""


_date: tuple[int, bytes] = (0, b"")


def _http_date() -> bytes:
    """The ``Date`` header's value, formatted once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True).encode())
    return _date[1]
