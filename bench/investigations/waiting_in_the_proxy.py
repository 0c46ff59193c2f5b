"""Why decisions beyond llama-server's slots lost throughput: waiting in the proxy
against waiting in llama-server's queue.

    .venv/bin/python bench/investigations/waiting_in_the_proxy.py [--rounds 4] [--tickets 40]

Two comparisons, each interleaved on one llama-server started as ``make run`` starts it
(4 slots), 8 clients:

- ``chat``: new tickets through llama-server's chat endpoint, the client keeping all 8
  requests in flight or at most 4 (as the proxy did when a decision beyond the slots
  waited in it), with llama-server's batch count (``n_decode_total``) per round;
- ``replay``: one decision replayed through two proxies, one with two calls per slot
  (``--max-connections 11``: a read waits in llama-server's queue behind another of its
  slot) and one with one (``--max-connections 6``: a slot lane of 4).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fresh  # noqa: E402
from _machine import describe  # noqa: E402
from _servers import llama_server_process, proxy_process  # noqa: E402
from overhead import PATH, PROXY_BODY, pct, run_batch  # noqa: E402


def decodes(llama_url: str) -> float:
    for line in httpx.get(llama_url + "/metrics").text.splitlines():
        if line.startswith("llamacpp:n_decode_total"):
            return float(line.split()[1])
    return 0.0


async def send(session, url, bodies, clients: int, in_flight: int):
    """``bodies`` sent by ``clients`` clients, at most ``in_flight`` at once."""
    latencies, queue, lane = [], iter(bodies), asyncio.Semaphore(in_flight)

    async def client():
        for body in queue:
            started = time.perf_counter()
            async with lane, session.post(url, data=body) as r:
                await r.read()
                assert r.status == 200, r.status
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, time.perf_counter() - started


async def chat(llama_url: str, tickets: int, rounds: int) -> None:
    numbers = itertools.count(1000)
    make = fresh.chat_body(fresh.OPTIONS, ["A", "B", "C", "D"], "conversation_first")
    totals = {8: [0, 0.0, 0.0], 4: [0, 0.0, 0.0]}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for i in range(rounds):
            for in_flight in (8, 4) if i % 2 else (4, 8):
                bodies = [make(next(numbers), t) for t in fresh.TICKETS[:tickets]]
                before = decodes(llama_url)
                latencies, wall = await send(session, llama_url + PATH, bodies, 8, in_flight)
                totals[in_flight][0] += len(latencies)
                totals[in_flight][1] += wall
                totals[in_flight][2] += decodes(llama_url) - before
    for in_flight, (n, wall, batches) in totals.items():
        print(
            f"  chat, at most {in_flight} in flight: {n / wall:.3f} req/s, "
            f"{batches / rounds:.1f} batches per {tickets} tickets"
        )
    print(f"  4 in flight / 8: {totals[4][0] / totals[4][1] / (totals[8][0] / totals[8][1]):.3f}")


async def replay(urls: dict[str, str], requests: int, rounds: int) -> None:
    totals: dict[str, list] = {name: [0, 0.0, []] for name in urls}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for url in urls.values():
            await run_batch(session, url + PATH, PROXY_BODY, 16, 8)  # warm
        for i in range(rounds):
            for name in list(urls) if i % 2 == 0 else list(urls)[::-1]:
                latencies, wall = await run_batch(
                    session, urls[name] + PATH, PROXY_BODY, requests, 8
                )
                totals[name][0] += len(latencies)
                totals[name][1] += wall
                totals[name][2] += latencies
    for name, (n, wall, latencies) in totals.items():
        print(
            f"  replay, {name}: {n / wall:.1f} req/s, p50 "
            f"{statistics.median(latencies) * 1e3:.1f} ms, p99 {pct(latencies, 99) * 1e3:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tickets", type=int, default=40)
    parser.add_argument("--replays", type=int, default=300, help="replays per round")
    args = parser.parse_args()
    with (
        llama_server_process() as (llama_url, _),
        proxy_process(llama_url) as (two, _),
        proxy_process(llama_url, ["--max-connections", "6"]) as (one, _),
    ):
        asyncio.run(chat(llama_url, args.tickets, args.rounds))
        asyncio.run(replay({"two calls per slot": two, "one call per slot": one}, args.replays, 6))
    print(describe())


if __name__ == "__main__":
    main()
