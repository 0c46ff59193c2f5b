"""upstream.py's lanes: the proxy never has more calls in flight to llama-server, nor
more connections open, than llama-server's slots + 2, whatever arrives; renderings
and tokenisations never wait behind reads and relayed generations."""

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config import Settings
from proxy.errors import UpstreamTimeout
from proxy.upstream import Lanes, Upstream

SLOW_S = 0.3  # a generation or read in the stand-in


@pytest.fixture
async def stand_in():
    """A llama-server stand-in that counts what it serves at once: requests in flight
    and connections open (each llama-server connection holds one of its threads)."""
    seen = {"now": 0, "most": 0, "open": set(), "most_open": 0}

    async def handler(request: web.Request) -> web.Response:
        seen["open"] = {t for t in seen["open"] if not t.is_closing()} | {request.transport}
        seen["most_open"] = max(seen["most_open"], len(seen["open"]))
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        try:
            if request.path in ("/completion", "/v1/chat/completions"):
                await asyncio.sleep(SLOW_S)
            if request.path == "/tokenize":
                return web.json_response({"tokens": [1, 2, 3]})
            if request.path == "/completion":
                timings = {"cache_n": 0, "prompt_n": 1, "prompt_ms": 1.0, "predicted_ms": 0.0}
                return web.json_response({"model": "m", "timings": timings})
            return web.json_response({"content": "done"})
        finally:
            seen["now"] -= 1

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app)
    await server.start_server()
    yield server, seen
    await server.close()


def test_lanes_follow_the_slots_or_the_setting() -> None:
    lanes = Lanes()
    assert (lanes.slot_size, lanes.quick._value) == (4, 2)  # llama-server's default -np
    lanes.follow_slots(3, "a")
    lanes.follow_slots(5, "b")  # a router: each model's slots
    assert lanes.slot_size == 8
    lanes.follow_slots(2, "b")
    assert lanes.slot_size == 5
    fixed = Lanes(max_connections=10)
    fixed.follow_slots(32, "a")
    assert fixed.slot_size == 8  # 10 less the quick lane's 2
    assert lanes.for_path("/tokenize") is lanes.quick
    assert lanes.for_path("/v1/models?x=1") is lanes.quick
    assert lanes.for_path("/completion") is lanes.slot
    assert lanes.for_path("/v1/embeddings") is lanes.slot


def test_a_connection_bound_below_three_is_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        Settings(upstream_url="http://x", max_connections=2)


async def test_a_burst_stays_within_slots_plus_two(stand_in) -> None:
    server, seen = stand_in
    upstream = Upstream(Settings(upstream_url=str(server.make_url(""))))
    upstream.lanes.follow_slots(4)

    async def generation() -> None:
        async with upstream.relay("POST", "/v1/chat/completions", b"{}", {}) as up:
            async for _ in up.chunks:
                pass

    async def read(slot: int) -> None:
        await upstream.complete([1, 2], slot=slot, cache=True)

    try:
        started = asyncio.get_running_loop().time()
        await asyncio.gather(
            *(generation() for _ in range(40)),
            *(read(i % 4) for i in range(20)),
            *(upstream.tokenize(f"text {i}") for i in range(60)),
        )
        took = asyncio.get_running_loop().time() - started
    finally:
        await upstream.close()
    # the 60 slow calls took their turns four at a time: at least 15 rounds of SLOW_S
    assert took >= 15 * SLOW_S * 0.9
    assert seen["most"] <= 4 + 2, seen
    assert seen["most_open"] <= 4 + 2, seen


async def test_tokenising_does_not_wait_behind_generations(stand_in) -> None:
    server, _seen = stand_in
    upstream = Upstream(Settings(upstream_url=str(server.make_url(""))))
    upstream.lanes.follow_slots(2)
    try:
        busy = [
            asyncio.create_task(upstream.complete([1], slot=i % 2, cache=True)) for i in range(20)
        ]
        await asyncio.sleep(0.05)
        started = asyncio.get_running_loop().time()
        assert await upstream.tokenize("hello") == [1, 2, 3]
        waited = asyncio.get_running_loop().time() - started
        assert waited < SLOW_S, waited  # not behind ten rounds of reads
        assert not all(task.done() for task in busy)
        await asyncio.gather(*busy)
    finally:
        await upstream.close()


async def test_a_call_that_cannot_get_a_place_in_time_is_a_timeout(stand_in) -> None:
    server, _seen = stand_in
    settings = Settings(upstream_url=str(server.make_url("")), request_timeout_s=0.5)
    upstream = Upstream(settings)
    upstream.lanes.follow_slots(1)
    try:
        first = asyncio.create_task(upstream.complete([1], slot=0, cache=True))
        await asyncio.sleep(0.05)
        with pytest.raises(UpstreamTimeout):
            # waits for the one place until the proxy's wait for llama-server is spent
            await asyncio.gather(*(upstream.complete([1], slot=0, cache=True) for _ in range(3)))
        await first
    finally:
        await upstream.close()
