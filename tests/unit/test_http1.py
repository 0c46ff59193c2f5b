"""The lean HTTP/1.1 client against a scripted server on a real socket."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable

import pytest

from proxy.http1 import ConnectionPool, Disconnected, Response, ResponseError

OK_JSON = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"a": true}'

# What the server does with one request: bytes to write (in separate writes) and
# whether to close afterwards; None: close without answering.
Script = Callable[[int], tuple[list[bytes], bool] | None]


class ScriptedServer:
    def __init__(self, script: Script):
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = 0
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = "http://127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                step = self.script(len(self.requests))
                if step is None:
                    break
                chunks, close = step
                for chunk in chunks:
                    writer.write(chunk)
                    await writer.drain()
                    await asyncio.sleep(0.01)  # separate reads on the client side
                if close:
                    break
        except asyncio.IncompleteReadError:
            self.closed_by_client += 1
        finally:
            writer.close()


def pool(url: str, **kw) -> ConnectionPool:
    return ConnectionPool(url, limit=kw.pop("limit", 4), keepalive_s=kw.pop("keepalive_s", 4.0),
                          connect_timeout_s=1.0)


async def test_content_length_answers_reuse_one_connection():
    async with ScriptedServer(lambda i: ([OK_JSON], False)) as server:
        client = pool(server.url)
        first = await client.request("POST", "/v1/x", b'{"q": 1}',
                                     {"Content-Type": "application/json"}, timeout_s=5)
        second = await client.request("GET", "/health", timeout_s=5)
        await client.close()
    assert first == second == Response(
        200, {"content-type": "application/json", "content-length": "11"}, b'{"a": true}')
    assert server.connections == 1
    sent = server.requests[0]
    assert sent.startswith(b"POST /v1/x HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"q\": 1}" in sent
    assert server.requests[1].startswith(b"GET /health HTTP/1.1\r\n")
    assert b"Content-Length" not in server.requests[1]


async def test_chunked_answers_are_decoded_across_reads():
    parts = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n",
             b"5\r\npedia\r\n", b"E\r\n in\r\n\r\nchunks.\r\n0\r\n", b"X-Trailer: 1\r\n\r\n"]
    async with ScriptedServer(lambda i: (parts, False)) as server:
        client = pool(server.url)
        answers = [await client.request("GET", "/", timeout_s=5) for _ in range(2)]
        await client.close()
    assert [a.body for a in answers] == [b"Wikipedia in\r\n\r\nchunks."] * 2
    assert server.connections == 1  # the connection stays usable after the trailer


async def test_a_body_without_length_runs_to_close_and_the_connection_is_not_reused():
    reply = [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of ", b"it"]
    async with ScriptedServer(lambda i: (reply, True)) as server:
        client = pool(server.url)
        answers = [await client.request("GET", "/", timeout_s=5) for _ in range(2)]
        await client.close()
    assert [a.body for a in answers] == [b"all of it"] * 2
    assert server.connections == 2


async def test_connection_close_interim_answers_and_204():
    replies = {
        1: [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 204 No Content\r\n\r\n"],
        2: [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"],
        3: [OK_JSON],
    }
    async with ScriptedServer(lambda i: (replies[min(i, 3)], False)) as server:
        client = pool(server.url)
        answers = [await client.request("GET", "/", timeout_s=5) for _ in range(3)]
        await client.close()
    assert [(a.status, a.body) for a in answers] == [(204, b""), (200, b"ok"), (200, b'{"a": true}')]
    assert server.connections == 2  # a new one after "Connection: close"


async def test_closed_before_any_answer_is_disconnected():
    async with ScriptedServer(lambda i: None) as server:
        client = pool(server.url)
        with pytest.raises(Disconnected):
            await client.request("GET", "/", timeout_s=5)
        await client.close()


@pytest.mark.parametrize("reply, says", [
    ([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"cut"], "cut short"),
    ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"], "cut short"),
    ([b"ICY 200 OK\r\n\r\n"], "not an HTTP/1.x status line"),
    ([b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"], "malformed header line"),
    ([b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n"], "not a number"),
    ([b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"], "not a number"),
    ([b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n"], "not a number"),
    ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\n"], "chunk size"),
    ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n"], "chunk size"),
    ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], "chunk size"),
    ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n"], "not followed by CRLF"),
    ([b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 70000], "too long"),
])
async def test_malformed_or_cut_answers_are_response_errors(reply, says):
    async with ScriptedServer(lambda i: (reply, True)) as server:
        client = pool(server.url)
        with pytest.raises(ResponseError, match=says):
            await client.request("GET", "/", timeout_s=5)
        await client.close()


async def test_a_timeout_aborts_the_connection_so_the_server_sees_the_client_go():
    async with ScriptedServer(lambda i: ([b"HTTP/1.1 200 OK\r\n"], False)) as server:
        client = pool(server.url)
        with pytest.raises(TimeoutError):
            await client.request("GET", "/", timeout_s=0.2)
        await asyncio.sleep(0.1)
        await client.close()
    assert server.closed_by_client == 1


async def test_a_cancelled_request_aborts_its_connection():
    async with ScriptedServer(lambda i: ([b"HTTP/1.1 200 OK\r\n"], False)) as server:
        client = pool(server.url)
        task = asyncio.create_task(client.request("GET", "/", timeout_s=30))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)
        assert server.closed_by_client == 1
        await client.close()


async def test_idle_connections_past_keepalive_are_not_reused():
    async with ScriptedServer(lambda i: ([OK_JSON], False)) as server:
        client = pool(server.url, keepalive_s=0.1)
        await client.request("GET", "/", timeout_s=5)
        await asyncio.sleep(0.2)
        await client.request("GET", "/", timeout_s=5)
        await client.close()
    assert server.connections == 2


async def test_bytes_after_an_answer_spoil_the_connection():
    async with ScriptedServer(lambda i: ([OK_JSON + b"garbage"], False)) as server:
        client = pool(server.url)
        for _ in range(2):
            assert (await client.request("GET", "/", timeout_s=5)).body == b'{"a": true}'
        await client.close()
    assert server.connections == 2


async def test_at_most_limit_connections_at_once():
    async with ScriptedServer(lambda i: ([b"", OK_JSON], False)) as server:
        client = pool(server.url, limit=2)
        answers = await asyncio.gather(*(client.request("GET", "/", timeout_s=5) for _ in range(6)))
        await client.close()
    assert all(a.status == 200 for a in answers)
    assert server.connections == 2


async def test_refused_connections_raise_oserror():
    client = pool("http://127.0.0.1:9")
    with pytest.raises(OSError):
        await client.request("GET", "/", timeout_s=5)
    await client.close()


@pytest.mark.parametrize("url", ["https://example.com", "unix:///tmp/x.sock", "http://"])
def test_only_plain_http_urls(url):
    with pytest.raises(ValueError, match="only http://"):
        ConnectionPool(url, limit=1, keepalive_s=1, connect_timeout_s=1)


async def test_waiting_for_a_free_connection_counts_against_the_timeout():
    async with ScriptedServer(lambda i: ([b"HTTP/1.1 200 OK\r\n"], False)) as server:
        client = pool(server.url, limit=1)
        stuck = asyncio.create_task(client.request("GET", "/", timeout_s=30))
        await asyncio.sleep(0.1)
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await client.request("GET", "/", timeout_s=0.3)
        assert asyncio.get_running_loop().time() - started < 1.0
        stuck.cancel()
        await client.close()


async def test_an_answer_before_the_whole_body_was_sent_does_not_reuse_the_connection():
    connections = []

    async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await reader.readuntil(b"\r\n\r\n")  # the head only: the body is never read
        writer.write(b"HTTP/1.1 413 Too Large\r\nContent-Length: 2\r\n\r\nno")
        await writer.drain()

    server = await asyncio.start_server(early, "127.0.0.1", 0)
    client = pool("http://127.0.0.1:%d" % server.sockets[0].getsockname()[1])
    for _ in range(2):
        answer = await client.request("POST", "/", b"x" * (32 << 20), timeout_s=5)
        assert (answer.status, answer.body) == (413, b"no")
    await client.close()
    for writer in connections:
        writer.close()
    server.close()
    await server.wait_closed()
    assert len(connections) == 2  # the half-sent one was dropped, not pooled


async def test_a_reset_while_reading_to_close_is_an_error_not_an_answer():
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"choices\": [")
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    client = pool("http://127.0.0.1:%d" % server.sockets[0].getsockname()[1])
    with pytest.raises(ResponseError, match="cut short"):
        await client.request("GET", "/", timeout_s=5)
    await client.close()
    server.close()
    await server.wait_closed()


async def test_a_close_after_an_interim_answer_is_not_resendable():
    async with ScriptedServer(lambda i: ([b"HTTP/1.1 100 Continue\r\n\r\n"], True)) as server:
        client = pool(server.url)
        with pytest.raises(ResponseError, match="cut short"):
            await client.request("GET", "/", timeout_s=5)
        await client.close()
