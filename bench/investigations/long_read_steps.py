"""Would sending a long read's steps differently close the ticket router's gap to the call
by hand at concurrency 8?

    .venv/bin/python bench/investigations/long_read_steps.py [--tickets 24] [--rounds 5]
                                                             [--concurrency 1,8]

On the prefix scheme a prompt of more than 256 tokens is read in two requests to one
leased slot: all but its last token, then the last token alone (proxy/kv.py), and a
decision waits in the proxy for a slot. The call by hand is one request, which waits in
llama-server's queue. Each ticket router prompt of bench/fresh.py (the call by hand's
text, numbered afresh for every target and round, so every read is of a new
conversation) is read straight from one llama-server started as make run starts it,
through ``/completion`` with its tokens, by five clients in rotating order:

- ``one``: the whole prompt in one request, not pinned (llama-server picks the slot and
  queues what it cannot start), as the call by hand;
- ``two``: a slot leased here, then the two requests one after the other, as the proxy;
- ``piped``: the same, the last token's request sent 1 ms after the first without
  waiting for its answer (llama-server queues it behind the first in that slot), saving
  a round trip between the two;
- ``queued``: as ``two``, but the next read of a slot sends its first request once the
  read before has sent its last (1 ms later), to wait in llama-server's queue rather
  than here;
- ``ordered``: as ``piped``, but the first request is streamed (``stream: true``) and the
  last token's request sent once its headers arrive, which llama-server sends when the
  slot starts the task: the second then waits in llama-server's queue for that slot,
  which takes it before any other when the slot frees (``pop_deferred_task``). The
  first's answer is read to its end unparsed (a proxy would have to parse its events
  to check its timings).

Prints per concurrency each client's p50 and throughput over all rounds, its p50 and
throughput against ``one``'s (the median of the rounds' own ratios, with their lowest
and highest), and how often its last-token request found other than all but one token
in its slot (``out of order``: llama-server took the two requests in the other order, or
another read came between; the proxy would then start the read again).
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
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fresh  # noqa: E402
from _machine import describe  # noqa: E402
from _servers import llama_server  # noqa: E402

LABELS = ["A", "B", "C", "D", "E", "F"]
CLIENTS = ("one", "two", "piped", "queued", "ordered")


def body(prompt: list[int], slot: int | None, read: bool, stream: bool = False) -> bytes:
    out = {"prompt": prompt, "cache_prompt": True, "n_predict": 1 if read else 0}
    out |= {"temperature": 0} | ({"n_probs": 24} if read else {})
    out |= {"stream": True} if stream else {}
    return orjson.dumps(out | ({} if slot is None else {"id_slot": slot}))


class Reads:
    def __init__(self, session: aiohttp.ClientSession, url: str, slots: int):
        self.session, self.url, self.slots = session, url, slots
        self.reordered: dict[str, int] = {}

    async def post(self, data: bytes) -> dict:
        async with self.session.post(self.url + "/completion", data=data) as r:
            r.raise_for_status()
            return orjson.loads(await r.read())

    async def prompts(self, numbers, n: int) -> list[list[int]]:
        hand = fresh.by_hand_body(fresh.ROUTER, LABELS)
        out = []
        for ticket in fresh.LONG_TICKETS[:n]:
            messages = orjson.loads(hand(next(numbers), ticket))["messages"]
            async with self.session.post(
                self.url + "/apply-template", json={"messages": messages}
            ) as r:
                text = (await r.json())["prompt"]
            async with self.session.post(
                self.url + "/tokenize", json={"content": text, "parse_special": True}
            ) as r:
                out.append((await r.json())["tokens"])
        return out

    def _last(self, client: str, answer: dict) -> None:
        if answer["timings"]["prompt_n"] != 1:
            self.reordered[client] = self.reordered.get(client, 0) + 1

    async def run(self, client: str, prompts: list[list[int]], concurrency: int):
        """(latencies, wall seconds) of reading ``prompts`` by ``client``."""
        gate = asyncio.Semaphore(concurrency)
        free: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(self.slots):
            free.put_nowait(slot)
        took: list[float] = []

        async def one(prompt: list[int]) -> None:
            await self.post(body(prompt, None, True))

        async def two(prompt: list[int]) -> None:
            slot = await free.get()
            try:
                await self.post(body(prompt[:-1], slot, False))
                self._last(client, await self.post(body(prompt, slot, True)))
            finally:
                free.put_nowait(slot)

        async def queued(prompt: list[int]) -> None:
            slot = await free.get()
            try:
                await self.post(body(prompt[:-1], slot, False))
                last = asyncio.ensure_future(self.post(body(prompt, slot, True)))
                await asyncio.sleep(0.001)  # sent: let it reach llama-server first
            finally:
                free.put_nowait(slot)  # the slot's next read may be sent now
            self._last(client, await last)

        async def piped(prompt: list[int]) -> None:
            slot = await free.get()
            try:
                first = asyncio.ensure_future(self.post(body(prompt[:-1], slot, False)))
                await asyncio.sleep(0.001)
                last = await self.post(body(prompt, slot, True))
                await first
                self._last(client, last)
            finally:
                free.put_nowait(slot)

        async def ordered(prompt: list[int]) -> None:
            slot = await free.get()
            try:
                first = body(prompt[:-1], slot, False, stream=True)
                # not kept for reuse: at concurrency 8 the next request on a streamed answer's
                # connection failed ("Can not write request body")
                close = {"Connection": "close"}
                async with self.session.post(
                    self.url + "/completion", data=first, headers=close
                ) as r:
                    r.raise_for_status()  # the headers: the slot has started the task
                    last = asyncio.ensure_future(self.post(body(prompt, slot, True)))
                    await r.read()
                self._last(client, await last)
            finally:
                free.put_nowait(slot)

        read = {
            "one": one,
            "two": two,
            "piped": piped,
            "queued": queued,
            "ordered": ordered,
        }[client]

        async def timed(prompt: list[int]) -> None:
            async with gate:
                started = time.perf_counter()
                await read(prompt)
                took.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(timed(p) for p in prompts))
        return took, time.perf_counter() - started


async def measure(url: str, tickets: int, rounds: int, levels: list[int]) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        async with session.get(url + "/props") as r:
            slots = int((await r.json())["total_slots"])
        reads = Reads(session, url, slots)
        numbers = itertools.count(1000)
        await reads.run("one", await reads.prompts(numbers, 4), 4)  # warm
        for concurrency in levels:
            took = {c: [] for c in CLIENTS}
            per_round = {c: [] for c in CLIENTS}  # (p50, throughput)
            walls = {c: 0.0 for c in CLIENTS}
            reads.reordered = {}
            for r in range(rounds):
                for client in CLIENTS[r % len(CLIENTS) :] + CLIENTS[: r % len(CLIENTS)]:
                    prompts = await reads.prompts(numbers, tickets)
                    latencies, wall = await reads.run(client, prompts, concurrency)
                    took[client] += latencies
                    walls[client] += wall
                    per_round[client].append((statistics.median(latencies), len(prompts) / wall))
            print(f"\nconcurrency {concurrency}, {slots} slots, {tickets} tickets x {rounds}")
            for client in CLIENTS:
                p50 = statistics.median(took[client]) * 1000
                thr = len(took[client]) / walls[client]
                line = f"  {client:7s} p50 {p50:8.1f} ms  throughput {thr:5.2f}/s"
                if client != "one":
                    ratios = [a[0] / b[0] for a, b in zip(per_round[client], per_round["one"])]
                    thrs = [a[1] / b[1] for a, b in zip(per_round[client], per_round["one"])]
                    line += (
                        f"  p50/one {statistics.median(ratios):.3f}"
                        f" ({min(ratios):.3f}-{max(ratios):.3f})"
                        f"  throughput/one {statistics.median(thrs):.3f}"
                        f" ({min(thrs):.3f}-{max(thrs):.3f})"
                        f"  out of order {reads.reordered.get(client, 0)}"
                    )
                print(line, f"n={len(took[client])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    print(describe())
    with llama_server() as url:
        asyncio.run(
            measure(url, args.tickets, args.rounds, [int(c) for c in args.concurrency.split(",")])
        )


if __name__ == "__main__":
    main()
