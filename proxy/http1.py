"""A lean HTTP/1.1 keep-alive client for the proxy's own calls to llama-server.

A decision costs llama-server about 10 ms on a small model, and the proxy's hop
must stay within a few percent of that (bench/overhead.py). aiohttp's client
spends about 0.35 ms of CPU per call in machinery this path never uses
(cookies, redirects, traces, streamed payloads), so the decision reads go
through this module: one ``asyncio.Protocol`` per connection, one write per
request, the whole answer buffered. Pass-through traffic (streams included)
still goes through aiohttp, which relays bodies as they arrive.

Failures, for the caller to translate:

    OSError (refused, unreachable)        connecting failed
    Disconnected(ConnectionError)         closed before any byte of the answer:
                                          the request may be sent again
    ResponseError                         a malformed or cut-short answer
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from .slots import Slots

__all__ = ["ConnectionPool", "Response", "Disconnected", "ResponseError"]

_MAX_HEAD = 64 * 1024  # status line and headers
_HEX = frozenset(b"0123456789abcdefABCDEF")


class Disconnected(ConnectionError):
    """The server closed the connection before answering."""


class ResponseError(Exception):
    """The answer is not HTTP/1.1 we can read, or it was cut short."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


class _Connection(asyncio.Protocol):
    """One connection; reads one answer at a time into a future."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop  # kept: asyncio.get_running_loop() costs a getpid() syscall
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.reusable = False
        self._waiter: asyncio.Future[Response] | None = None
        self._buffer = bytearray()
        self._head: tuple[int, dict[str, str]] | None = None
        self._length: int | None = None  # None: chunked or until close
        self._chunked = False
        self._body = bytearray()  # decoded chunks so far
        self._pos = 0  # parse position in _buffer, chunked only
        self._extra = False  # bytes beyond the answer arrived with it
        self._received = False  # any byte of the answer (an interim 1xx included)

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.reusable = False  # bytes nobody asked for: never reuse this connection
            return
        self._received = True
        self._buffer += data
        try:
            done = self._parse()
        except ResponseError as exc:
            self._fail(exc)
            return
        if done is not None:
            self._finish(done)

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self.transport = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if (exc is None and self._head is not None and self._length is None
                and not self._chunked):
            self._finish(bytes(self._buffer))  # the body runs until the server closes
        elif not self._received:
            self._fail(Disconnected("llama-server closed the connection before answering"))
        else:
            self._fail(ResponseError("the answer was cut short"))

    # -- one exchange ----------------------------------------------------------

    async def exchange(self, request: bytes, timeout_s: float) -> Response:
        """Write ``request``; the answer, or ``TimeoutError`` after ``timeout_s``."""
        if timeout_s <= 0:
            raise TimeoutError("no time left to send the request")
        waiter = self._send(request)
        timer = self._loop.call_later(timeout_s, self._time_out)
        try:
            return await waiter
        finally:
            timer.cancel()

    def _time_out(self) -> None:
        self._fail(TimeoutError("no complete answer in time"))

    def _send(self, request: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None and (self._waiter is None or self._waiter.done())
        self._waiter = self._loop.create_future()
        self._buffer.clear()
        self._body.clear()
        self._head, self._length, self._chunked, self._pos = None, None, False, 0
        self._extra = self._received = False
        self.reusable = False
        self.transport.write(request)
        return self._waiter

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    def _finish(self, body: bytes) -> None:
        assert self._head is not None and self._waiter is not None
        status, headers = self._head
        self.reusable = (
            self.transport is not None and headers.get("connection", "").lower() != "close"
            and (self._length is not None or self._chunked) and not self._extra
            # an early answer (a refusal) can come before the whole body was sent
            and self.transport.get_write_buffer_size() == 0
        )
        self._waiter.set_result(Response(status, headers, body))

    def _fail(self, exc: Exception) -> None:
        self.abort()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    # -- parsing -----------------------------------------------------------------

    def _parse(self) -> bytes | None:
        """The whole body once it has arrived, else ``None``."""
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > _MAX_HEAD:
                    raise ResponseError("the answer's headers are too long")
                return None
            self._head = _parse_head(bytes(self._buffer[:end]))
            del self._buffer[: end + 4]
            status, headers = self._head
            if status < 200:  # 1xx: an interim answer; the real one follows
                self._head = None
                return self._parse()
            if status in (204, 304):
                self._length = 0
            elif "chunked" in headers.get("transfer-encoding", "").lower():
                self._chunked = True
            elif "content-length" in headers:
                value = headers["content-length"]
                if not (value.isascii() and value.isdigit()):
                    raise ResponseError(f"the answer's Content-Length is not a number: {value!r}")
                self._length = int(value)
        if self._chunked:
            return self._parse_chunks()
        if self._length is not None and len(self._buffer) >= self._length:
            self._extra = len(self._buffer) > self._length
            return bytes(self._buffer[: self._length])
        return None

    def _parse_chunks(self) -> bytes | None:
        buf = self._buffer
        while True:
            line_end = buf.find(b"\r\n", self._pos)
            if line_end < 0:
                return None
            size_text = bytes(buf[self._pos:line_end]).split(b";", 1)[0].strip()
            if not size_text or not _HEX.issuperset(size_text):
                raise ResponseError(f"the answer's chunk size is not a number: {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:  # the last chunk; trailers end with an empty line
                end = line_end + 4 if buf[line_end:line_end + 4] == b"\r\n\r\n" else (
                    buf.find(b"\r\n\r\n", line_end) + 4)
                if end < 4:
                    return None
                self._extra = len(buf) > end
                return bytes(self._body)
            start = line_end + 2
            if len(buf) < start + size + 2:
                return None
            if buf[start + size:start + size + 2] != b"\r\n":
                raise ResponseError("the answer's chunk is not followed by CRLF")
            self._body += buf[start:start + size]
            self._pos = start + size + 2


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ResponseError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ResponseError(f"malformed header line: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class ConnectionPool:
    """Keep-alive connections to one ``http://host:port``, at most ``limit`` at a time.

    An idle connection is dropped after ``keepalive_s`` (set it below the
    server's own keep-alive, or a request can be written into a closing socket).
    A request that is cancelled or fails aborts its connection, so the server
    sees the client go away.
    """

    def __init__(self, url: str, *, limit: int, keepalive_s: float, connect_timeout_s: float):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http://host[:port] URLs are supported, not {url!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self._prefix = parts.path.rstrip("/")
        host_header = parts.netloc.rpartition("@")[2]
        self._head_tail = f"Host: {host_header}\r\n".encode("latin-1")
        self._keepalive_s = keepalive_s
        self._connect_timeout_s = connect_timeout_s
        self._slots = Slots(limit)
        self._idle: list[_Connection] = []
        self._closed = False

    async def request(
        self, method: str, path: str, body: bytes | None = None,
        headers: Mapping[str, str] | None = None, *, timeout_s: float,
    ) -> Response:
        """Send one request; ``Disconnected`` only when nothing was answered,
        ``TimeoutError`` when the whole answer took longer than ``timeout_s``
        (waiting for a free connection and connecting included; connecting
        has its own, shorter limit too)."""
        head = [f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1"), self._head_tail]
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"Content-Length: %d\r\n\r\n" % len(body) if body is not None else b"\r\n")
        message = b"".join(head) + (body or b"")
        deadline = time.monotonic() + timeout_s
        if not self._slots.take():  # every connection busy: the wait counts against timeout_s
            async with asyncio.timeout(timeout_s):
                await self._slots.wait()
        try:
            conn = self._take_idle() or await self._connect(deadline)
            try:
                response = await conn.exchange(message, deadline - time.monotonic())
            except BaseException:
                conn.abort()
                raise
            if conn.reusable and not self._closed:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.abort()
            return response
        finally:
            self._slots.release()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.abort()

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used is the least likely to be stale
            fresh = now - conn.idle_since < self._keepalive_s
            if conn.reusable and conn.transport is not None and fresh:
                return conn
            conn.abort()
        return None

    async def _connect(self, deadline: float) -> _Connection:
        if self._closed:
            raise Disconnected("the connection pool is closed")
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(min(self._connect_timeout_s, deadline - time.monotonic())):
            _, conn = await loop.create_connection(
                lambda: _Connection(loop), self._host, self._port)
        return conn
