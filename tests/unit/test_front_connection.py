"""The front's per-connection cycle with a recording transport: pipelined requests
are answered in order, one at a time, and none while the client is not reading."""

import asyncio

import orjson

from proxy.app import create_app
from proxy.app_keys import SERVICE
from proxy.config import Settings
from proxy.front import Front


class Transport:
    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False
        self.protocol = None

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def set_protocol(self, protocol) -> None:
        self.protocol = protocol


class EchoFront(Front):
    """Every request answered with its own body, by the real connection logic."""

    def plan(self, path, raw):
        async def answer():
            await asyncio.sleep(0.01)
            return orjson.loads(raw)
        return "openai", answer


def request(n: int) -> bytes:
    body = orjson.dumps({"n": n})
    return b"POST /v1/decisions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def front() -> EchoFront:
    app = create_app(Settings())
    app[SERVICE] = None  # never used by EchoFront
    return EchoFront(app, handoff=lambda: None)


def answered(transport: Transport) -> list[int]:
    return [orjson.loads(w.split(b"\r\n\r\n", 1)[1])["n"] for w in transport.writes]


async def settle():
    for _ in range(20):
        await asyncio.sleep(0.01)


async def test_pipelined_requests_are_answered_in_order():
    conn, transport = front()(), Transport()
    conn.connection_made(transport)
    conn.data_received(request(1) + request(2) + request(3)[:30])
    await settle()
    assert answered(transport) == [1, 2]
    conn.data_received(request(3)[30:])
    await settle()
    assert answered(transport) == [1, 2, 3]
    conn.connection_lost(None)


async def test_no_pipelined_request_is_served_while_the_client_is_not_reading():
    conn, transport = front()(), Transport()
    conn.connection_made(transport)
    conn.data_received(request(1) + request(2) + request(3))
    conn.pause_writing()  # the answers are piling up unread
    await settle()
    assert answered(transport) == [1]  # the one in progress is written, no more
    conn.resume_writing()
    await settle()
    assert answered(transport) == [1, 2, 3]
    conn.connection_lost(None)
