"""What decision records cost a decision: the same decisions through four proxies in front of
one llama-server, side by side in one run, records off, to stdout read through a pipe (a
container runtime's log collector), to stdout on /dev/null, and to a file.

    .venv/bin/python bench/records_cost.py [--requests 600] [--rounds 12] [--questions 8]
                                      [--concurrency 1,8] [--standin]

Two bodies: a chat decision (one record) and a System One request of ``--questions``
questions about one state (as many records). The proxies take turns in short rounds (the
order rotating), so the machine's drift falls on all of them alike. Prints, per body and
concurrency, each proxy's p50 and p99 latency, requests per second and the proxy's CPU
milliseconds per request (its process, writer thread included, from /proc), and each one's
ratio to records off. After the rounds it checks that every decision left one record and
that none was dropped (``semif_decision_records_dropped_total``).

``--standin``: the zero-latency stand-in (tests/standin.py) instead of llama-server, so the
ratios show the records' cost against the proxy's own work alone, the hardest case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import orjson
from _machine import describe
from _servers import _settle, free_port, llama_server_process, standin_process
from overhead import pct, rotated, run_batch

from scripts.stack import CONNECTIONS, UBATCH, start_proxy, stop, wait_ready

CHAT = orjson.dumps(
    {
        "messages": [{"role": "user", "content": "Ticket: I was charged twice for one order."}],
        "semif": {"options": ["billing", "shipping", "technical", "other"]},
    }
)
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")
SINKS = ("off", "pipe", "devnull", "file")


def system_one(questions: int) -> bytes:
    return orjson.dumps(
        {
            "state": "Hello, my card was charged twice for order 1182 and the parcel is late.",
            "questions": {
                f"q{i}": {
                    "type": "choice",
                    "instructions": f"Which team should answer point {i + 1}?",
                    "criteria": ["billing", "shipping", "technical"],
                }
                for i in range(questions)
            },
        }
    )


def cpu_s(pid: int) -> float:
    """The process's user and system CPU seconds so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


class Drained:
    """A pipe read to its end by a thread, lines counted: a log collector that keeps up."""

    def __init__(self, stream) -> None:
        self.lines = 0
        self._stream = stream
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines += line.startswith(b'{"record":"semif.decision/1"')

    def join(self) -> None:
        self._thread.join(30)


@contextlib.contextmanager
def proxy_with(sink: str, upstream_url: str, ubatch: int | None) -> Iterator[dict]:
    """A proxy whose records go to ``sink``; yields its URL, process and how to count its
    records."""
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "records.jsonl"
        extra = {
            "off": [],
            "pipe": ["--decision-records", "stdout"],
            "devnull": ["--decision-records", "stdout"],
            "file": ["--decision-records", str(path)],
        }[sink]
        out = {"pipe": subprocess.PIPE, "devnull": subprocess.DEVNULL}.get(sink)
        with open(Path(folder) / "log", "wb") as log:
            proc = start_proxy(
                port,
                upstream_url,
                extra,
                log=out or log,
                ubatch=ubatch,
                connections=ubatch and CONNECTIONS,
            )
            drained = Drained(proc.stdout) if sink == "pipe" else None
            url = f"http://127.0.0.1:{port}"
            try:
                wait_ready(url + "/livez", proc, timeout_s=30)
                _settle(url)  # /health: once the self-check has settled
                yield {"url": url, "proc": proc, "path": path, "drained": drained}
            finally:
                stop(proc)
                if drained is not None:
                    drained.join()


async def measure(proxies, bodies, requests, rounds, concurrency):
    """Per body: each proxy's rounds as (latencies, wall s, CPU s)."""
    results = {body: {sink: [] for sink in proxies} for body in bodies}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for (path, data), proxy in ((b, p) for b in bodies.values() for p in proxies.values()):
            await run_batch(session, proxy["url"] + path, data, 10, concurrency)  # warm
        per_round = max(1, requests // rounds)
        for i in range(rounds):
            for name, (path, data) in bodies.items():
                for sink in rotated(list(proxies), i):
                    proxy = proxies[sink]
                    before = cpu_s(proxy["proc"].pid)
                    latencies, wall = await run_batch(
                        session, proxy["url"] + path, data, per_round, concurrency
                    )
                    spent = cpu_s(proxy["proc"].pid) - before
                    results[name][sink].append((latencies, wall, spent))
    return results


def figures(rounds) -> tuple[float, float, float, float]:
    """p50 ms, p99 ms, requests/s and proxy CPU ms per request, the rounds pooled."""
    latencies = [t for lat, _, _ in rounds for t in lat]
    wall = sum(w for _, w, _ in rounds)
    cpu = sum(c for _, _, c in rounds)
    n = len(latencies)
    return pct(latencies, 50) * 1e3, pct(latencies, 99) * 1e3, n / wall, cpu * 1e3 / n


def report(results, concurrency: int) -> None:
    for body, by_sink in results.items():
        rows = {sink: figures(rounds) for sink, rounds in by_sink.items()}
        n = sum(len(lat) for lat, _, _ in by_sink["off"])
        print(f"\n{body}, concurrency {concurrency}, {n} requests per proxy")
        print(f"  {'records':10}{'p50 ms':>12}{'p99 ms':>12}{'req/s':>12}{'CPU ms/req':>12}")
        for sink, row in rows.items():
            print(f"  {sink:10}" + "".join(f"{v:12.3f}" for v in row))
        for sink in SINKS[1:]:
            ratios = [mine / off for mine, off in zip(rows[sink], rows["off"])]
            print(f"  {sink + '/off':10}" + "".join(f"{r:12.3f}" for r in ratios))


def check(proxies, decisions: int) -> None:
    """Every decision left a record where it went, and none was dropped."""
    for sink, proxy in proxies.items():
        if sink == "off":
            continue
        metrics = httpx.get(proxy["url"] + "/metrics", timeout=30).text
        dropped = next(
            (
                float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith("semif_decision_records_dropped_total ")
            ),
            None,
        )
        written = next(
            (
                float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith("semif_decision_records_written_total ")
            ),
            None,
        )
        print(f"  {sink}: {written:.0f} records written, {dropped:.0f} dropped")
        if proxy["drained"] is not None:
            print(f"  pipe: {proxy['drained'].lines} records read from the pipe so far")
        if sink == "file":
            lines = proxy["path"].read_bytes().count(b"\n")
            print(f"  file: {lines} lines in the file ({decisions} decisions asked for)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="per proxy, body, concurrency")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--questions", type=int, default=8, help="of the System One body")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--standin", action="store_true", help="no model: the stand-in")
    args = parser.parse_args()
    print(describe())
    bodies = {
        "chat decision (1 record)": ("/v1/chat/completions", CHAT),
        f"System One, {args.questions} questions ({args.questions} records)": (
            "/v1/systemone",
            system_one(args.questions),
        ),
    }
    upstream = standin_process() if args.standin else llama_server_process()
    ubatch = None if args.standin else UBATCH
    with upstream as (llama_url, _), contextlib.ExitStack() as stack:
        proxies = {sink: stack.enter_context(proxy_with(sink, llama_url, ubatch)) for sink in SINKS}
        levels = [int(c) for c in args.concurrency.split(",")]
        for concurrency in levels:
            results = asyncio.run(measure(proxies, bodies, args.requests, args.rounds, concurrency))
            report(results, concurrency)
        sent = max(1, args.requests // args.rounds) * args.rounds + 10  # rounds and warm-up
        decisions = 1 + sent * (1 + args.questions) * len(levels)  # and the settling one
        print("\nrecords, the warm-up and the settling decision included:")
        check(proxies, decisions)


if __name__ == "__main__":
    main()
