"""Proxy overhead: one decision through the proxy vs the same one-token read sent
straight to llama-server, interleaved in one run, at concurrency 1 and 8.

    .venv/bin/python bench/overhead.py [--starts 3] [--requests 1800] [--rounds 12] [--pause-ms 0]
                                       [--pin] [--standin [--read-ms MS]]

``--pin``: llama-server on core 1 (with ``-t 1 -tb 1``: two threads on one core
spin-wait on each other), everything else (proxy, relay, this client) on core 0,
so the hop and the model do not share a core.

``--standin``: the zero-latency stand-in (tests/standin.py, 8 slots) instead of
llama-server: the hop's cost with no model beside it. With ``--pause-ms`` (say 15, a
read's time here) it shows what the hop costs when it runs after the machine has
idled, as every read at concurrency 1 does while llama-server computes. With
``--read-ms`` (say 10) the stand-in takes that long to answer each ``/completion``, as a
read would: the hop's work before the read and after it each run after an idle wait, as
beside llama-server, with no model on the cores.

Prints p50/p99 latency and throughput for each target and the ratios to direct,
each ratio with a 95% interval for the noise between rounds and the range over
the starts. Targets: latency ratio <= 1.05 at concurrency 1; throughput >= 0.95
of direct at 8.

Two sources of noise, two remedies. Within a start, the machine's speed drifts:
targets take turns in short rounds, and a round (every target in the same few
seconds) is resampled whole for the interval. Between starts, the ratios move
by more than their rounds show (two single-start runs: latency intervals of
1.046-1.080 and 0.990-1.052): the servers are started afresh ``--starts`` times
and the rounds of all starts pooled. The interval resamples rounds within their
start, so it does not cover the shift between starts; the lowest and highest
start are printed for that (three starts are too few to resample).

Two direct reads: ``direct`` is the cheapest equivalent, ``/completion`` with the
prompt's tokens (what the proxy sends: proxy/kv.py), and ``chat`` the same read
through llama-server's chat endpoint (it renders the template and builds a chat
answer each time). Ratios are to ``direct``. A bare relay (bench/_relay.py: aiohttp
server and client, no decision logic, forwarding the ``direct`` body) is measured
beside them as ``relay``: what any Python hop costs here, the part of the ratio
the proxy's own logic cannot remove.

llama-server runs with ``make run``'s flags and more HTTP threads (``BESIDE_PROXY`` in
bench/_servers.py), as this client and the relay connect to it beside the proxy. Requests
that took over a second are counted under the table: a stall, not the hop.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import statistics
import time
from collections.abc import Iterable

import aiohttp
import httpx
import orjson
from _servers import (
    BESIDE_PROXY,
    bare_relay,
    llama_server_process,
    pin,
    proxy_process,
    standin_process,
)

from proxy.config import Settings
from proxy.decision.prompt import append_to_conversation, options_block
from proxy.decision.question import choice_question
from proxy.reading import read_widths

MESSAGES = [{"role": "user", "content": "Ticket: I was charged twice for one order."}]
OPTIONS = {
    "billing": "charges, refunds, invoices",
    "shipping": "delivery and parcels",
    "technical": "bugs, crashes, log-in problems",
    "other": None,
}
PROXY_BODY = orjson.dumps({"messages": MESSAGES, "semif": {"options": OPTIONS}})
PATH = "/v1/chat/completions"


def prompt_tokens(llama_url: str, labels: list[str]) -> list[int]:
    """The decision's prompt as llama-server's chat endpoint tokenises it."""
    messages = append_to_conversation(MESSAGES, options_block(choice_question(OPTIONS), labels))
    with httpx.Client(base_url=llama_url, timeout=60) as client:
        text = client.post(
            "/apply-template",
            json={"messages": messages, "chat_template_kwargs": {"enable_thinking": False}},
        ).json()
        return client.post(
            "/tokenize", json={"content": text["prompt"], "add_special": True}
        ).json()["tokens"]


def completion_body(llama_url: str, labels: list[str]) -> bytes:
    """The proxy's read of this decision once the prompt is in the slot's cache."""
    return orjson.dumps(
        {
            "prompt": prompt_tokens(llama_url, labels),
            "id_slot": 0,
            "cache_prompt": True,
            "n_predict": 1,
            "temperature": 0,
            "n_probs": read_widths(Settings().n_probs, len(labels), None)[0],
        }
    )


def direct_body(labels: list[str], messages: list[dict] = MESSAGES) -> bytes:
    """Exactly the one-token read the proxy sends for this decision (about ``messages``)."""
    question = choice_question(OPTIONS)
    return orjson.dumps(
        {
            "messages": append_to_conversation(messages, options_block(question, labels)),
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": read_widths(Settings().n_probs, len(labels), None)[0],
            "cache_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )


async def run_batch(session, url, body, n, concurrency, pause_s=0.0) -> tuple[list[float], float]:
    """``body`` sent ``n`` times by ``concurrency`` clients: (latencies, wall time)."""
    return await send_all(session, url, itertools.repeat(body, n), concurrency, pause_s)


async def send_all(
    session, url, bodies: Iterable[bytes], concurrency: int, pause_s: float = 0.0
) -> tuple[list[float], float]:
    """``bodies`` sent in turn by ``concurrency`` clients: (latencies, wall time)."""
    latencies: list[float] = []
    queue = iter(bodies)

    async def worker():
        for body in queue:
            if pause_s:
                await asyncio.sleep(pause_s)  # a client's own time between requests
            t0 = time.perf_counter()
            async with session.post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as r:
                await r.read()
                assert r.status == 200, r.status
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def rotated(items: list, i: int) -> list:
    """``items`` started at position ``i`` (wrapping): round ``i``'s order, so that no
    target always comes first."""
    return items[i % len(items) :] + items[: i % len(items)]


def pct(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


async def decision_labels(proxy_url: str) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy_url + "/v1/chat/completions", data=PROXY_BODY) as r:
            answer = (await r.json())["semif"]
    assert answer["reads"] == 1, "the decision needed a wider read: not one call to compare"
    return list(answer["labels"].values())


async def measure(targets, requests, rounds, concurrency, pause_s=0.0):
    """Each target's rounds, as (latencies, wall time); the order rotates per round."""
    results: dict[str, list[tuple[list[float], float]]] = {name: [] for name in targets}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for url, body in targets.values():  # warm every path
            await run_batch(session, url, body, 10, concurrency)
        per_round = max(1, requests // rounds)
        names = list(targets)
        for i in range(rounds):
            for name in rotated(names, i):
                url, body = targets[name]
                results[name].append(
                    await run_batch(session, url, body, per_round, concurrency, pause_s)
                )
    return results


def figures(rounds: list[tuple[list[float], float]]) -> tuple[float, float, float]:
    """p50 ms, p99 ms and requests/s over the given rounds, pooled."""
    latencies = [t for lat, _ in rounds for t in lat]
    wall = sum(w for _, w in rounds)
    return pct(latencies, 50) * 1e3, pct(latencies, 99) * 1e3, len(latencies) / wall


def intervals(results, name: str, starts: int, resamples: int = 1000) -> list[tuple[float, float]]:
    """95% intervals of ``name``'s p50, p99 and throughput ratios to direct: each
    start's rounds resampled with replacement, the same rounds for both targets."""
    rng = random.Random(0)
    per_start = len(results[name]) // starts
    ratios = []
    for _ in range(resamples):
        picks = [
            start * per_start + rng.randrange(per_start)
            for start in range(starts)
            for _ in range(per_start)
        ]
        mine = figures([results[name][i] for i in picks])
        direct = figures([results["direct"][i] for i in picks])
        ratios.append([m / d for m, d in zip(mine, direct)])
    edges = [statistics.quantiles(column, n=40) for column in zip(*ratios)]
    return [(cuts[0], cuts[-1]) for cuts in edges]  # 2.5% and 97.5%


def report(concurrency, results, starts: int) -> None:
    rows = {name: figures(rounds) for name, rounds in results.items()}
    per_start = len(results["direct"]) // starts
    by_start = [
        {
            name: figures(rounds[i * per_start : (i + 1) * per_start])
            for name, rounds in results.items()
        }
        for i in range(starts)
    ]
    print(
        f"\nconcurrency {concurrency}, {sum(len(lat) for lat, _ in results['direct'])} "
        "requests per target"
    )
    print(f"  {'':8}{'p50 ms':>14}{'p99 ms':>14}{'req/s':>14}")
    for name, (p50, p99, thr) in rows.items():
        print(f"  {name:8}{p50:14.2f}{p99:14.2f}{thr:14.1f}")
    slow = {name: sum(t > 1 for lat, _ in rounds for t in lat) for name, rounds in results.items()}
    if any(slow.values()):  # a stall, not the hop: it moves throughput more than p99
        print("  requests over 1 s: " + ", ".join(f"{k} {v}" for k, v in slow.items()))
    direct = rows["direct"]
    if "chat" in rows:
        print(
            f"  the proxy adds {rows['proxy'][0] - direct[0]:.2f} ms at p50 to the direct "
            f"/completion read, {rows['proxy'][0] - rows['chat'][0]:.2f} ms to the same read "
            "through llama-server's chat endpoint"
        )
    for name in [n for n in rows if n != "direct"]:
        ratios = [mine / d for mine, d in zip(rows[name], direct)]
        print(f"  {name + '/':8}" + "".join(f"{r:14.3f}" for r in ratios) + "   ratio to direct")
        print(
            f"  {'':8}"
            + "".join(f"{f'{lo:.3f}-{hi:.3f}':>14}" for lo, hi in intervals(results, name, starts))
            + "   95% interval, rounds"
        )
        if starts > 1:
            spans = [[row[name][k] / row["direct"][k] for row in by_start] for k in range(3)]
            print(
                f"  {'':8}"
                + "".join(f"{f'{min(v):.3f}-{max(v):.3f}':>14}" for v in spans)
                + "   lowest-highest of the starts"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3, help="fresh starts of every server")
    parser.add_argument(
        "--requests", type=int, default=1800, help="per target and concurrency, over all starts"
    )
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds per start")
    parser.add_argument("--llama-args", default="", help="extra llama-server flags, one string")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="llama-server on core 1, the proxy, relay and client on core 0",
    )
    parser.add_argument(
        "--standin",
        action="store_true",
        help="the zero-latency stand-in upstream instead of llama-server",
    )
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="each client's idle time before each request (default: none; "
        "the event loop's timers round it up to whole milliseconds)",
    )
    parser.add_argument(
        "--read-ms",
        type=float,
        default=0.0,
        help="with --standin: how long it takes to answer each /completion (default: none)",
    )
    args = parser.parse_args()
    if args.standin and args.llama_args:
        parser.error("--llama-args: the stand-in is not llama-server")
    if args.read_ms and not args.standin:
        parser.error("--read-ms: a stand-in's; llama-server takes its own time")
    results: dict[int, dict[str, list]] = {1: {}, 8: {}}
    for _ in range(args.starts):
        for concurrency, rounds in once(
            args.llama_args.split(),
            args.requests // args.starts,
            args.rounds,
            args.pause_ms / 1e3,
            args.pin,
            args.standin,
            args.read_ms,
        ).items():
            for name, measured in rounds.items():
                results[concurrency].setdefault(name, []).extend(measured)
    print(
        f"{args.starts} starts x {args.rounds} rounds, "
        f"{args.pause_ms:g} ms pause before each request"
        + (
            f"; {'the stand-in' if args.standin else 'llama-server'} pinned to core 1, the rest "
            "to core 0"
            if args.pin
            else ""
        )
        + (
            f"; upstream: the stand-in, no model, answering /completion after {args.read_ms:g} ms"
            if args.standin
            else ""
        )
    )
    for concurrency, rounds in results.items():
        report(concurrency, rounds, args.starts)


def once(
    llama_args: list[str],
    requests: int,
    rounds: int,
    pause_s: float,
    pinned: bool = False,
    standin: bool = False,
    read_ms: float = 0.0,
) -> dict[int, dict[str, list]]:
    """Every target's rounds at concurrency 1 and 8, on servers started for this."""
    if pinned:
        llama_args = [*llama_args, "-t", "1", "-tb", "1"]
    upstream = (
        standin_process(read_ms=read_ms)
        if standin
        else llama_server_process(extra=[*BESIDE_PROXY, *llama_args])
    )
    with upstream as (llama_url, llama), proxy_process(llama_url) as (proxy_url, hop):
        labels = asyncio.run(decision_labels(proxy_url))
        direct = completion_body(llama_url, labels)
        print(f"the decision's prompt: {len(orjson.loads(direct)['prompt'])} tokens", flush=True)
        with bare_relay(llama_url, direct) as (relay_url, relay):
            if pinned:
                pin(llama.pid, 1)
                for pid in (hop.pid, relay.pid, os.getpid()):
                    pin(pid, 0)
            targets = {
                "proxy": (proxy_url + PATH, PROXY_BODY),
                "relay": (relay_url + PATH, b"{}"),
                "chat": (llama_url + PATH, direct_body(labels)),
                "direct": (llama_url + "/completion", direct),
            }
            return {
                concurrency: asyncio.run(measure(targets, requests, rounds, concurrency, pause_s))
                for concurrency in (1, 8)
            }


if __name__ == "__main__":
    main()
