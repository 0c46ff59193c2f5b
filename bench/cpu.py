"""CPU per decision: the proxy's own CPU time (user + system, from /proc) per decision,
beside a bare aiohttp relay doing the same hop, against the zero-latency stand-in
upstream (tests/standin.py, its own process), in interleaved rounds of one run.

    .venv/bin/python bench/cpu.py [--rounds 6] [--requests 3000] [--concurrency 8]

The proxy (one worker, then ``--workers 2``) and the relay each run pinned to core 0;
the stand-in and this load generator share core 1, so what is measured on core 0 is
the hop alone. The relay (bench/_relay.py) reads the body, sends the proxy's exact
upstream read with the same aiohttp client settings and parses the answer: the cost
of any Python hop here. Prints µs per decision for each target, the ratios, and for
two workers how the decisions were shared. Targets (issue 14): proxy <= 1.3x the
relay; two workers' summed CPU within 10% of one worker's.
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


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and of every process it started."""
    total = 0.0
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total += (int(stat[11]) + int(stat[12])) * TICK_S
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        with contextlib.suppress(FileNotFoundError):
            total += cpu_s(int(child))
    return total


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


@contextlib.contextmanager
def started(command: list[str], core: int, ready: str) -> Iterator[subprocess.Popen]:
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(["taskset", "-c", str(core), *command], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(ready, proc, timeout_s=30)
            yield proc
        finally:
            proc.terminate()
            proc.wait(30)


async def rounds(targets: dict[str, tuple[str, bytes, int]], n_rounds: int, requests: int,
                 concurrency: int) -> dict[str, list[float]]:
    """Each target's CPU seconds per decision, one figure per round; the order rotates."""
    out: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        for url, body, _ in targets.values():
            await run_batch(s, url, body, 50, concurrency)
        for i in range(n_rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                url, body, pid = targets[name]
                before = cpu_s(pid)
                await run_batch(s, url, body, requests, concurrency)
                out[name].append((cpu_s(pid) - before) / requests)
    return out


async def labels(url: str) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + PATH, data=PROXY_BODY) as r:
            return list((await r.json())["semif"]["labels"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=3000, help="per round and target")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("bench/cpu.py needs two cores: the hop on one, the load on the other")
    os.sched_setaffinity(0, {1})
    py = sys.executable
    standin_port = free_port()
    standin = f"http://127.0.0.1:{standin_port}"
    ports = {name: free_port() for name in ("proxy", "workers", "relay")}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    pid: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(started([py, "-m", "tests.standin", str(standin_port), "--tokens"],
                                    1, standin + "/health"))
        for name, extra in (("proxy", []), ("workers", ["--workers", "2"])):
            pid[name] = stack.enter_context(started(
                [py, "-m", "proxy", "--port", str(ports[name]), "--upstream-url", standin, *extra],
                0, url[name] + "/metrics")).pid
        body_file = stack.enter_context(tempfile.NamedTemporaryFile(suffix=".json"))
        body_file.write(completion_body(standin, asyncio.run(labels(url["proxy"]))))
        body_file.flush()
        pid["relay"] = stack.enter_context(started(
            [py, str(ROOT / "bench" / "_relay.py"), standin, str(ports["relay"]), body_file.name],
            0, url["relay"] + "/health")).pid
        workers = children(pid["workers"])
        before = {worker: cpu_s(worker) for worker in workers}
        targets = {"proxy": (url["proxy"] + PATH, PROXY_BODY, pid["proxy"]),
                   "workers": (url["workers"] + PATH, PROXY_BODY, pid["workers"]),
                   "relay": (url["relay"] + PATH, b"{}", pid["relay"])}
        measured = asyncio.run(rounds(targets, args.rounds, args.requests, args.concurrency))
        shares = [cpu_s(worker) - before[worker] for worker in workers]
    print(describe())
    print(f"{args.rounds} rounds x {args.requests} decisions per target, concurrency "
          f"{args.concurrency}; hop pinned to core 0, stand-in and load on core 1; "
          f"CPU from /proc (tick {TICK_S * 1e3:g} ms)")
    print(f"  {'':10}{'µs/decision':>14}{'lowest':>10}{'highest':>10}")
    med = {}
    for name, values in measured.items():
        med[name] = statistics.median(values)
        print(f"  {name:10}{med[name] * 1e6:14.0f}{min(values) * 1e6:10.0f}"
              f"{max(values) * 1e6:10.0f}")
    ratio = [p / r for p, r in zip(measured["proxy"], measured["relay"])]
    print(f"  proxy/relay   {med['proxy'] / med['relay']:.3f}  (per round "
          f"{min(ratio):.3f}-{max(ratio):.3f}; target <= 1.3)")
    both = [w / p for w, p in zip(measured["workers"], measured["proxy"])]
    print(f"  workers/proxy {med['workers'] / med['proxy']:.3f}  (per round "
          f"{min(both):.3f}-{max(both):.3f}; target <= 1.10)")
    total = sum(shares) or 1.0
    print("  two workers' shares of the CPU: "
          + ", ".join(f"{s / total:.0%}" for s in shares))


if __name__ == "__main__":
    main()
