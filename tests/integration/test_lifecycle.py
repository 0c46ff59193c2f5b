"""The connection lifecycle (aiohttp serving the proxy), in process against the stand-in
llama-server:
idle keep-alive connections close, busy ones do not, a client that leaves cancels
its upstream call, and a drain lets requests in progress finish (up to its limit)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import orjson
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.server import Server
from tests.conftest import free_port
from tests.standin import StandIn

BODY = orjson.dumps(
    {
        "messages": [{"role": "user", "content": "route it"}],
        "semif": {"options": ["billing", "shipping"]},
    }
)
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    + BODY
)


@pytest.fixture
def standin():
    with StandIn() as s:
        yield s


_writers: list[asyncio.StreamWriter] = []


@pytest.fixture
async def make_server(standin) -> AsyncIterator:
    servers: list[Server] = []

    async def make(keepalive_s: float = 75.0, shutdown_timeout_s: float = 5.0) -> Server:
        settings = Settings(
            upstream_url=standin.url, port=free_port(), shutdown_timeout_s=shutdown_timeout_s
        )
        server = Server(create_app(settings), settings, keepalive_s=keepalive_s)
        await server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.close()
    while _writers:
        writer = _writers.pop()
        writer.close()
        await writer.wait_closed()


async def connect(server: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection, closed when the test ends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    _writers.append(writer)
    return reader, writer


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
    body = await reader.readexactly(int(headers["content-length"]))
    return int(head[0].split()[1]), headers, body


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    return await asyncio.wait_for(reader.read(1), seconds) == b""


async def test_an_idle_connection_is_closed_after_the_keepalive(make_server):
    server = await make_server(keepalive_s=0.3)
    reader, writer = await connect(server)
    writer.write(REQUEST)
    assert (await answer(reader))[0] == 200
    started = time.monotonic()
    assert await closed_within(reader, 10)
    assert time.monotonic() - started > 0.2  # after the keep-alive, not at once


async def test_a_half_sent_request_does_not_hold_a_connection(make_server):
    server = await make_server(keepalive_s=0.3)
    reader, writer = await connect(server)
    writer.write(REQUEST[:40])
    assert await closed_within(reader, 3)


async def test_a_request_longer_than_the_keepalive_is_answered(make_server, standin):
    standin.mode, standin.delay_s = "slow", 1.0
    server = await make_server(keepalive_s=0.3)
    reader, writer = await connect(server)
    writer.write(REQUEST)
    status, headers, _ = await answer(reader)
    assert status == 200 and headers.get("connection", "").lower() != "close"
    writer.write(REQUEST)  # and the connection is still usable
    assert (await answer(reader))[0] == 200


async def test_a_client_that_leaves_cancels_the_upstream_call(make_server, standin):
    standin.mode, standin.delay_s = "slow", 5.0
    server = await make_server()
    reader, writer = await connect(server)
    writer.write(REQUEST)
    await asyncio.sleep(0.5)  # the stand-in is holding the read
    writer.close()
    deadline = time.monotonic() + 3
    while standin.cancelled == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert standin.cancelled == 1


async def test_close_lets_requests_in_flight_finish(make_server, standin):
    standin.mode, standin.delay_s = "slow", 0.8
    server = await make_server()
    busy_reader, busy_writer = await connect(server)
    idle_reader, idle_writer = await connect(server)
    busy_writer.write(REQUEST)
    await asyncio.sleep(0.3)
    closing = asyncio.create_task(server.close())
    assert await closed_within(idle_reader, 0.5)  # idle: closed at once
    status, headers, body = await answer(busy_reader)
    assert status == 200
    assert set(orjson.loads(body)["semif"]["probabilities"]) == {"billing", "shipping"}
    assert await closed_within(busy_reader, 1)  # answered, then closed
    await closing
    assert standin.cancelled == 0


async def test_close_cancels_what_outlives_the_timeout(make_server, standin):
    standin.mode, standin.delay_s = "slow", 30.0
    server = await make_server(shutdown_timeout_s=0.5)
    reader, writer = await connect(server)
    writer.write(REQUEST)
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await server.close()
    assert time.monotonic() - started < 3
    assert await closed_within(reader, 1)
    deadline = time.monotonic() + 3
    while standin.cancelled == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert standin.cancelled == 1


async def test_a_half_sent_request_after_a_long_one_does_not_hold_the_connection(
    make_server, standin
):
    standin.mode, standin.delay_s = "slow", 0.8  # outlives the keep-alive
    server = await make_server(keepalive_s=0.3)
    reader, writer = await connect(server)
    writer.write(REQUEST + REQUEST[:40])  # the next request pipelined, half sent
    assert (await answer(reader))[0] == 200
    assert await closed_within(reader, 3)


async def test_a_slow_body_is_not_idle(make_server):
    server = await make_server(keepalive_s=0.4)
    reader, writer = await connect(server)
    for i in range(0, len(REQUEST), len(REQUEST) // 6):  # 6+ pieces over ~0.9 s
        writer.write(REQUEST[i : i + len(REQUEST) // 6])
        await asyncio.sleep(0.15)
    assert (await answer(reader))[0] == 200
