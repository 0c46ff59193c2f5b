"""The front door: plain decision requests answered without aiohttp's request machinery.

Every connection starts here. A request that is plainly a decision (HTTP/1.1
``POST`` to a decision path, framed by one ``Content-Length`` within the body
limit, a JSON object asking for one JSON answer) is answered on this protocol,
through the same route functions, authentication, error bodies and metrics as
the aiohttp application. Anything else (pass-through and streams, other
methods and paths, chunked or oversized bodies, ``Expect``, HTTP/1.0, bad JSON,
a head this parser does not like) hands the connection over to aiohttp, with
every byte received so far, for the rest of its life; nothing of it has been
answered or lost.

Why: on a 2-core machine a decision reads in ~12 ms, and bench/overhead.py
measured a hop through aiohttp's server at 2-4% of that (latency and
throughput) against 0.5-2% through a bare ``asyncio.Protocol`` (see README).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any

import orjson
from aiohttp import web

from .app_keys import METRICS, SERVICE, SETTINGS
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

__all__ = ["Front"]

log = logging.getLogger("proxy")

_MAX_HEAD = 8190  # longer heads go to aiohttp, whose limits decide
_KEEPALIVE_S = 75.0  # idle keep-alive connections are closed after this (aiohttp's default)
_HEADER = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
_OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"

# (api whose error shape answers the request, the coroutine that builds the JSON answer)
Plan = tuple[str, Callable[[], Awaitable[Any]]]


class Front:
    """The protocol factory for the listening socket. ``handoff`` makes aiohttp's
    protocol for a connection (``AppRunner.server``)."""

    def __init__(self, app: web.Application, handoff: Callable[[], asyncio.Protocol]):
        self._app = app
        self._handoff = handoff
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
        (their connections close after the answer), then cancel the rest."""
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

    async def serve(self, conn: _Connection, path: bytes, plan: Plan, auth: str) -> None:
        """What the middleware does around a handler: metrics, authentication,
        errors in the API's own shape."""
        route = path.decode()
        api, answer = plan
        metrics = self._metrics
        metrics.request_started(route)
        upstream = upstream_seconds()
        started = time.perf_counter()
        status = 499  # the client went away before an answer
        try:
            try:
                authenticate(self._settings, auth)
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
        self._head: tuple[int, bytes, int, bool, str] | None = None  # parsed, body pending
        self._keep_alive = True
        self._paused = False
        self._idle: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        self._front._connections.add(self)
        self._wait_idle()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self.task is None:
            self._next()
        elif len(self._buffer) > self._front._settings.max_body_bytes + _MAX_HEAD:
            assert self._transport is not None
            self._transport.pause_reading()  # pipelined past what one request may hold
            self._paused = True

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
            if head is None or head[1] > self._front._settings.max_body_bytes:
                self._hand_off()
                return
            self._head = (end + 4, *head)
        start, path, length, keep_alive, auth = self._head
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
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self.task = asyncio.get_running_loop().create_task(self._serve(path, plan, auth))

    async def _serve(self, path: bytes, plan: Plan, auth: str) -> None:
        await self._front.serve(self, path, plan, auth)
        self.task = None
        if self._transport is None or self._transport.is_closing():
            return
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        if self._buffer:
            self._next()  # pipelined
        else:
            self._wait_idle()

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
        self._idle = asyncio.get_running_loop().call_later(_KEEPALIVE_S, self.close)

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
        if self._paused:
            transport.resume_reading()


def _parse_head(head: bytes) -> tuple[bytes, int, bool, str] | None:
    """(path, Content-Length, keep-alive, Authorization) of a request this front
    serves; ``None`` for anything else (aiohttp answers those)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if (len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1"
            or not parts[1].startswith(b"/")):
        return None
    length: int | None = None
    keep_alive, auth = True, None
    for line in lines[1:]:
        match = _HEADER.fullmatch(line)
        if match is None:
            return None
        name, value = match.group(1).lower(), match.group(2)
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif name == b"connection":
            tokens = {t.strip().lower() for t in value.split(b",")}
            if b"upgrade" in tokens:
                return None
            keep_alive = b"close" not in tokens
        elif name in (b"transfer-encoding", b"expect", b"upgrade"):
            return None
        elif name == b"authorization" and auth is None:
            auth = value.decode("utf-8", "surrogateescape")
    if length is None:
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
