"""CPU per decision: the proxy's own CPU time (user + system, from /proc) per decision,
beside a bare aiohttp relay doing the same hop, against the zero-latency stand-in
upstream (tests/standin.py, its own process), in interleaved rounds of one run.

    .venv/bin/python bench/cpu.py [--rounds 10] [--requests 2000] [--concurrency 8]

The proxies (``proxy`` and ``queued``) and the relay run pinned to core 0; the stand-ins
and this load generator share core 1, so what is measured on core 0 is the hop alone. The
relay (bench/_relay.py) reads the body, sends the proxy's exact upstream read with the
same aiohttp client settings and parses the answer: the cost of any Python hop here.

The stand-in reports llama-server's timings as if each evaluated token took
``TOKEN_MS``, so the proxy's cost model fills and each decision's cost is estimated for
admission, as beside llama-server (without timings the estimate is skipped). It has as
many slots as there are requests in flight, so no decision waits
for one, as the relay never waits. ``queued`` is the proxy against a stand-in with 2
slots, where the rest wait in the proxy for a slot, as they do when more decisions arrive
than llama-server has slots.

Prints µs per decision for each target and the ratios, each the median of the rounds'
own ratios (the targets of a round run seconds apart, so a drift in the machine's
speed cancels). The ratios are reported, not targets (the proxy's time over the relay
is: bench/overhead.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from _machine import describe
from _servers import ROOT, free_port, wait_ready
from overhead import PROXY_BODY, completion_body, run_batch

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
PATH = "/v1/chat/completions"
TOKEN_MS = "0.05"  # a token's prompt time the stand-in reports (a figure of its own: the
# estimate costs the same whatever it is)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and of every process it started."""
    total = 0.0
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total += (int(stat[11]) + int(stat[12])) * TICK_S
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        with contextlib.suppress(FileNotFoundError):
            total += cpu_s(int(child))
    return total


@contextlib.contextmanager
def started(command: list[str], core: int, ready: str) -> Iterator[subprocess.Popen]:
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            ["taskset", "-c", str(core), *command],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_ready(ready, proc, timeout_s=30)
            yield proc
        finally:
            proc.terminate()
            proc.wait(30)


async def rounds(
    targets: dict[str, tuple[str, bytes, list[int]]],
    n_rounds: int,
    requests: int,
    concurrency: int,
) -> dict[str, list[float]]:
    """Each target's CPU seconds per decision (summed over its processes), one figure per
    round; the order rotates."""
    out: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        for url, body, _ in targets.values():
            await run_batch(s, url, body, 50, concurrency)
        for i in range(n_rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                url, body, pids = targets[name]
                before = sum(map(cpu_s, pids))
                await run_batch(s, url, body, requests, concurrency)
                out[name].append((sum(map(cpu_s, pids)) - before) / requests)
    return out


async def labels(url: str) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + PATH, data=PROXY_BODY) as r:
            return list((await r.json())["semif"]["labels"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=2000, help="per round and target")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    if args.concurrency < 3:
        parser.error("--concurrency must be at least 3: the queued case has 2 slots")
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("bench/cpu.py needs two cores: the hop on one, the load on the other")
    os.sched_setaffinity(0, {1})
    py = sys.executable
    standins = {slots: free_port() for slots in (args.concurrency, 2)}
    upstream = {slots: f"http://127.0.0.1:{port}" for slots, port in standins.items()}
    ports = {name: free_port() for name in ("proxy", "queued", "relay")}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    pids: dict[str, list[int]] = {}
    with contextlib.ExitStack() as stack:
        for slots, port in standins.items():
            stack.enter_context(
                started(
                    [py, "-m", "tests.standin", str(port), "--tokens", "--slots", str(slots)]
                    + ["--token-ms", TOKEN_MS],
                    1,
                    upstream[slots] + "/health",
                )
            )
        for name, slots in (("proxy", args.concurrency), ("queued", 2)):
            pids[name] = [
                stack.enter_context(
                    started(
                        [
                            py,
                            "-m",
                            "proxy",
                            "--port",
                            str(ports[name]),
                            "--upstream-url",
                            upstream[slots],
                        ],
                        0,
                        url[name] + "/metrics",
                    )
                ).pid
            ]
        body_file = stack.enter_context(tempfile.NamedTemporaryFile(suffix=".json"))
        body_file.write(
            completion_body(upstream[args.concurrency], asyncio.run(labels(url["proxy"])))
        )
        body_file.flush()
        relay = [py, str(ROOT / "bench" / "_relay.py"), upstream[args.concurrency]]
        pids["relay"] = [
            stack.enter_context(
                started([*relay, str(ports["relay"]), body_file.name], 0, url["relay"] + "/health")
            ).pid
        ]
        targets = {
            name: (url[name] + PATH, b"{}" if name == "relay" else PROXY_BODY, pids[name])
            for name in ("proxy", "queued", "relay")
        }
        measured = asyncio.run(rounds(targets, args.rounds, args.requests, args.concurrency))
    print(describe())
    print(
        f"{args.rounds} rounds x {args.requests} decisions per target, concurrency "
        f"{args.concurrency}; hop pinned to core 0, stand-ins and load on core 1; "
        f"CPU from /proc (tick {TICK_S * 1e3:g} ms)"
    )
    print(f"  {'':10}{'µs/decision':>14}{'lowest':>10}{'highest':>10}")
    med = {}
    for name, values in measured.items():
        med[name] = statistics.median(values)
        print(
            f"  {name:10}{med[name] * 1e6:14.0f}{min(values) * 1e6:10.0f}{max(values) * 1e6:10.0f}"
        )

    def ratio(a: str, b: str, label: str) -> float:
        per_round = [x / y for x, y in zip(measured[a], measured[b])]
        middle = statistics.median(per_round)
        print(
            f"  {a + '/' + b:15}{middle:7.3f}  (per round {min(per_round):.3f}-"
            f"{max(per_round):.3f}){label}"
        )
        return middle

    ratio("proxy", "relay", "; reported (no target)")
    ratio(
        "queued",
        "proxy",
        f"; {args.concurrency - 2} of {args.concurrency} waiting for one of 2 slots",
    )


if __name__ == "__main__":
    main()
