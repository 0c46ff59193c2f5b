"""Decisions on conversations llama-server has not seen: through the proxy (its
repeatable read, proxy/kv.py) against the same one-token read sent straight to
llama-server's chat endpoint, interleaved in one run, at concurrency 1 and 8.

    .venv/bin/python bench/fresh.py [--rounds 3]

bench/overhead.py measures a replay: one prompt sent again and again, which the
slot's cache serves. Here every request is a new conversation (each ticket of
tests/data/tickets.jsonl, numbered afresh each time it is sent, so no two requests
share more than the chat template's opening and the first digits of that number),
which is what most decision traffic is. The chat endpoint reuses whatever prefix
the slot it picks holds; the proxy evaluates the conversation cold from the first
token and the question in chunks, so that the answer does not depend on what came
before (docs/repeatability.md): this prints what that costs.

Prints, per concurrency, p50 and throughput of each target over all rounds, and
the ratio proxy/chat with the lowest and highest round's ratio; each round sends
every ticket once to each target, in rotating order.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics

import aiohttp
import orjson
from _machine import describe
from _servers import ROOT, llama_server_process, proxy_process
from overhead import OPTIONS, PATH, decision_labels, direct_body, rotated, send_all

TICKETS = [json.loads(line)["state"]
           for line in (ROOT / "tests" / "data" / "tickets.jsonl").read_text().splitlines()]


def conversation(number: int, ticket: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Ticket {number}: {ticket}"}]


def proxy_body(number: int, ticket: str) -> bytes:
    return orjson.dumps({"messages": conversation(number, ticket), "semif": {"options": OPTIONS}})


def chat_body(labels: list[str]):
    """The chat-endpoint read the proxy's decision stands for: bench/overhead.py's
    ``chat`` target, about one conversation."""
    return lambda number, ticket: direct_body(labels, conversation(number, ticket))


async def measure(targets, rounds: int, concurrency: int, numbers) -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in targets}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for i in range(rounds):
            for name in rotated(list(targets), i):
                url, make = targets[name]
                bodies = [make(next(numbers), ticket) for ticket in TICKETS]
                out[name].append(await send_all(session, url, bodies, concurrency))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    numbers = itertools.count(1000)
    with llama_server_process() as (llama_url, _), proxy_process(llama_url) as (proxy_url, _):
        labels = asyncio.run(decision_labels(proxy_url))
        targets = {"proxy": (proxy_url + PATH, proxy_body),
                   "chat": (llama_url + PATH, chat_body(labels))}
        results = {c: asyncio.run(measure(targets, args.rounds, c, numbers)) for c in (1, 8)}
    print(describe())
    print(f"{args.rounds} rounds x {len(TICKETS)} new conversations per target")
    for concurrency, measured in results.items():
        print(f"\nconcurrency {concurrency}")
        print(f"  {'':8}{'p50 ms':>12}{'req/s':>12}")
        rows = {}
        for name, rounds in measured.items():
            latencies = [t for lat, _ in rounds for t in lat]
            rows[name] = (statistics.median(latencies) * 1e3,
                          len(latencies) / sum(wall for _, wall in rounds))
            print(f"  {name:8}{rows[name][0]:12.1f}{rows[name][1]:12.2f}")
        proxy, chat = ([(statistics.median(lat), len(lat) / wall) for lat, wall in measured[name]]
                       for name in ("proxy", "chat"))
        for k, what in ((0, "p50"), (1, "throughput")):
            ratios = [p[k] / c[k] for p, c in zip(proxy, chat)]
            print(f"  proxy/chat {what}: {rows['proxy'][k] / rows['chat'][k]:.3f} "
                  f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
