"""Proxy overhead: one decision through the proxy vs the same one-token call sent
straight to llama-server, interleaved in one run, at concurrency 1 and 8.

    .venv/bin/python bench/overhead.py [--requests 1200] [--rounds 24]

Prints p50/p99 latency and throughput for each target and the ratios to direct.
Targets: latency ratio <= 1.05 at concurrency 1; throughput >= 0.95 of direct at 8.

Two bare relays (bench/_relay.py: the proxy's upstream client and no decision
logic) are measured beside them: ``hop``, served by a bare asyncio.Protocol as
proxy/front.py serves decisions, shows what any Python hop costs here (the part
of the ratio the proxy's own logic cannot remove); ``aiohttp``, served by an
aiohttp application, what aiohttp's server adds to that.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aiohttp
import orjson
from _servers import bare_relay, llama_server, proxy

from proxy.config import Settings
from proxy.decision.labels import gbnf_alternatives
from proxy.decision.prompt import append_to_conversation, options_block
from proxy.decision.question import choice_question
from proxy.service import read_widths

MESSAGES = [{"role": "user", "content": "Ticket: I was charged twice for one order."}]
OPTIONS = {"billing": "charges, refunds, invoices", "shipping": "delivery and parcels",
           "technical": "bugs, crashes, log-in problems", "other": None}
PROXY_BODY = orjson.dumps({"messages": MESSAGES, "semif": {"options": OPTIONS}})
PATH = "/v1/chat/completions"


def direct_body(labels: list[str]) -> bytes:
    """Exactly the one-token read the proxy sends for this decision."""
    question = choice_question(OPTIONS)
    return orjson.dumps({
        "messages": append_to_conversation(MESSAGES, options_block(question, labels)),
        "max_tokens": 1, "temperature": 0, "logprobs": True,
        "top_logprobs": read_widths(Settings().n_probs, len(labels), None)[0],
        "grammar": gbnf_alternatives(labels), "cache_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    })


async def run_batch(session, url, body, n, concurrency) -> tuple[list[float], float]:
    latencies: list[float] = []
    queue = iter(range(n))

    async def worker():
        for _ in queue:
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                await r.read()
                assert r.status == 200, r.status
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def decision_labels(proxy_url: str) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy_url + "/v1/chat/completions", data=PROXY_BODY) as r:
            answer = (await r.json())["semif"]
    assert answer["reads"] == 1, "the decision needed a wider read: not one call to compare"
    return list(answer["labels"].values())


async def measure(targets, requests, rounds, concurrency):
    """Each target's latencies and wall time, in rounds whose order rotates."""
    results = {name: ([], 0.0) for name in targets}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for url, body in targets.values():  # warm every path
            await run_batch(session, url, body, 10, concurrency)
        per_round = max(1, requests // rounds)
        names = list(targets)
        for i in range(rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                url, body = targets[name]
                lat, wall = await run_batch(session, url, body, per_round, concurrency)
                acc, total = results[name]
                results[name] = (acc + lat, total + wall)
    return results


def report(concurrency, results) -> None:
    rows = {name: (pct(lat, 50) * 1e3, pct(lat, 99) * 1e3, len(lat) / wall)
            for name, (lat, wall) in results.items()}
    print(f"\nconcurrency {concurrency}")
    print(f"  {'':8}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}")
    for name, (p50, p99, thr) in rows.items():
        print(f"  {name:8}{p50:10.2f}{p99:10.2f}{thr:10.1f}")
    dp50, dp99, dthr = rows["direct"]
    for name in [n for n in rows if n != "direct"]:
        p50, p99, thr = rows[name]
        print(f"  {name + '/':8}{p50 / dp50:10.3f}{p99 / dp99:10.3f}{thr / dthr:10.3f}"
              "   (ratio to direct)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1200, help="per target and concurrency")
    parser.add_argument("--rounds", type=int, default=24, help="interleaved rounds")
    parser.add_argument("--llama-args", default="", help="extra llama-server flags, one string")
    args = parser.parse_args()
    with llama_server(extra=args.llama_args.split()) as llama_url, proxy(llama_url) as proxy_url:
        direct = direct_body(asyncio.run(decision_labels(proxy_url)))
        with (bare_relay(llama_url, direct, "protocol") as hop_url,
              bare_relay(llama_url, direct, "aiohttp") as aiohttp_url):
            targets = {"proxy": (proxy_url + PATH, PROXY_BODY), "hop": (hop_url + PATH, b"{}"),
                       "aiohttp": (aiohttp_url + PATH, b"{}"), "direct": (llama_url + PATH, direct)}
            for concurrency in (1, 8):
                report(concurrency, asyncio.run(measure(targets, args.requests, args.rounds,
                                                        concurrency)))


if __name__ == "__main__":
    main()
