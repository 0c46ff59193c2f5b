"""HTTP/1.1 for the front door: one client connection's cycle.

Heads are parsed here only far enough to tell a plain request (see
``parse_head``) from anything else; bodies are framed by ``Content-Length``;
pipelined requests are answered one at a time, in order; idle connections
close after ``Front.keepalive_s``. Whatever the front does not serve, the
connection hands to aiohttp, with every byte received, for the rest of its
life. What is served, and how it is answered, is ``front.Front``'s business.
"""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .front import Front, Plan

__all__ = ["Connection", "parse_head"]

_MAX_HEAD = 8190  # longer heads go to aiohttp, whose limits decide
# A head may hold tabs, CRLFs and any byte from space up, except DEL; a header's
# name only these (RFC 9110 "token"). Deleting them must leave nothing.
_HEAD_BYTES = b"\t\r\n" + bytes(range(0x20, 0x7F)) + bytes(range(0x80, 0x100))
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


class Connection(asyncio.Protocol):
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
        self._front.connections.add(self)
        self._wait_idle()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self.task is None:
            self._idle_since = asyncio.get_running_loop().time()  # a slow body is not idle
            if not self._write_paused:
                self._next()
        elif len(self._buffer) > self._front.max_body_bytes + _MAX_HEAD:
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
        self._front.connections.discard(self)
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
            head = parse_head(bytes(self._buffer[:end]))
            if (head is None or head[1] > self._front.max_body_bytes
                    or not self._front.authorized(head[3])):
                self._hand_off()
                return
            self._head = (end + 4, *head[:3])
        start, path, length, keep_alive = self._head
        if len(self._buffer) < start + length:
            return  # the body is still arriving
        plan = self._front.plan(path, bytes(self._buffer[start:start + length]))
        if plan is None:
            self._hand_off()
            return
        del self._buffer[:start + length]
        self._head = None
        self._keep_alive = keep_alive  # and not closing: checked as the answer is written
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
        protocol = self._front.handoff()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if data:
            protocol.data_received(data)


def parse_head(head: bytes) -> tuple[bytes, int, bool, str] | None:
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
