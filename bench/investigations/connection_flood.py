"""Why planning calls waited 5, 10, ... 55 s in a burst: llama-server's HTTP threads
against many new connections at once.

    .venv/bin/python bench/investigations/connection_flood.py [--calls 150] [--rounds 4]

llama-server (cpp-httplib) serves each open connection with one thread: a fixed pool
of ``--threads-http`` threads (b11434: ``max(-np + 4, cores - 1)``) and more started
on demand. Each round sends ``--calls`` ``/apply-template`` calls at once (each
answered in about a millisecond), while llama-server is idle and while 8 generations
run, unbounded (one new connection per call and per generation) or bounded as the
proxy bounds them (``proxy/upstream.py``, ``Lanes``: the generations through 4
connections, one per slot, the calls through 2), and prints the slowest call and how
many took over a second.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _machine import describe  # noqa: E402
from _servers import llama_server  # noqa: E402

GENERATIONS = 8  # running beside the calls in the busy rounds


async def flood(url: str, calls: int, limit: int, busy: bool) -> list[float]:
    connector = aiohttp.TCPConnector(limit=limit)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        aiohttp.ClientSession() as gen,
    ):

        async def generation(i: int) -> None:
            body = {"prompt": f"Write a long story about cat {i}.", "n_predict": 200}
            async with gen.post(url + "/completion", json=body) as resp:
                await resp.read()

        async def one(i: int) -> float:
            started = time.monotonic()
            body = {"messages": [{"role": "user", "content": f"hello {i}"}]}
            async with session.post(url + "/apply-template", json=body) as resp:
                await resp.read()
            return time.monotonic() - started

        running = [asyncio.create_task(generation(i)) for i in range(GENERATIONS if busy else 0)]
        if busy:
            await asyncio.sleep(1.0)  # the generations hold slots and threads
        took = await asyncio.gather(*(one(i) for i in range(calls)))
        await asyncio.gather(*running)
    return sorted(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    machine = describe()
    print(f"{machine['date']} {machine['cpu']} ({machine['cpu_level']}, {machine['cores']} cores)")
    with llama_server() as url:
        for bounded in (False, True):
            for busy in (False, True):
                rows = [
                    asyncio.run(flood(url, args.calls, bounded, busy)) for _ in range(args.rounds)
                ]
                slowest = max(r[-1] for r in rows)
                late = sum(sum(t > 1.0 for t in r) for r in rows)
                median = sorted(t for r in rows for t in r)[args.calls * args.rounds // 2]
                state = "8 generations running" if busy else "idle"
                how = "bounded" if bounded else "unbounded"
                print(
                    f"{how:9}, {state:21}: p50 {median * 1000:6.0f} ms, "
                    f"slowest {slowest:5.2f} s, over 1 s: {late} "
                    f"of {args.calls * args.rounds} calls ({args.rounds} rounds)"
                )


if __name__ == "__main__":
    main()
