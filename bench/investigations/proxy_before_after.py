"""Is the proxy's own work per decision larger than an earlier version's?

    .venv/bin/python bench/investigations/proxy_before_after.py --before DIR [--read-ms 10]
                                                            [--token-ms MS] [--rounds 12]
                                                            [--requests 150] [--llama]

The proxy as it is and the proxy of another checkout (``--before``: a directory holding
it, for example ``git worktree add /tmp/before b1576d9``; run with this ``.venv``), both
in front of one stand-in (tests/standin.py, no model) that answers each ``/completion``
after ``--read-ms``, as a read would: the same decision, replayed, at concurrency 1, the
two proxies taking turns in rounds whose order alternates. Prints each proxy's p50 and
the CPU time its event loop spent per decision (``/proc/PID/schedstat``: on the CPU,
whether in Python or the kernel, the metrics recorded after the answer included), and
for each the median, over the rounds, of the round's difference (a drift in the machine's
speed cancels within a round). No llama-server, so what differs is the proxies' own work.

``--token-ms``: the stand-in reports llama-server's timings, as if each evaluated token
took that long, so that the proxy estimates each decision's cost for admission as it
does beside llama-server (without timings its cost model stays empty and the estimate
returns at once). ``--llama``: llama-server (as ``make run`` starts it) instead of the
stand-in; its reads take their own time (``--read-ms`` is the stand-in's), and the CPU
per decision is the comparison to read.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _machine import describe  # noqa: E402
from _servers import (  # noqa: E402
    _serving,
    llama_server_process,
    proxy_process,
    standin_process,
    start_proxy,
)
from overhead import PATH, PROXY_BODY, run_batch  # noqa: E402

HEADERS = {"Content-Type": "application/json"}


def before_proxy(upstream_url: str, directory: Path):
    """The proxy of the checkout in ``directory``, with its own defaults."""
    return _serving(
        lambda port, log: start_proxy(port, upstream_url, log=log, cwd=directory), timeout_s=60
    )


def cpu_s(pid: int) -> float:
    """Seconds the process's main thread (the event loop) has been on a CPU (Linux)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


async def compare(urls: dict[str, str], pids: dict[str, int], rounds: int, requests: int) -> None:
    pooled: dict[str, list[float]] = {name: [] for name in urls}
    cpu: dict[str, list[float]] = {name: [] for name in urls}
    differences, cpu_differences = [], []
    async with aiohttp.ClientSession() as session:
        for url in urls.values():
            await run_batch(session, url, PROXY_BODY, 20, 1)  # warm
        for i in range(rounds):
            names = list(urls) if i % 2 == 0 else list(urls)[::-1]
            p50 = {}
            for name in names:
                started = cpu_s(pids[name])
                latencies, _ = await run_batch(session, urls[name], PROXY_BODY, requests, 1)
                cpu[name].append((cpu_s(pids[name]) - started) / requests * 1e6)
                pooled[name] += latencies
                p50[name] = statistics.median(latencies)
            differences.append((p50["now"] - p50["before"]) * 1e3)
            cpu_differences.append(cpu["now"][-1] - cpu["before"][-1])
    for name, latencies in pooled.items():
        print(
            f"  {name:7s} p50 {statistics.median(latencies) * 1e3:.2f} ms (n = {len(latencies)}), "
            f"CPU per decision {statistics.median(cpu[name]):.0f} us (median of {rounds} rounds)"
        )
    print(
        f"  now - before, per round: p50 median {statistics.median(differences):+.2f} ms, "
        f"range {min(differences):+.2f} to {max(differences):+.2f}; CPU per decision median "
        f"{statistics.median(cpu_differences):+.0f} us, range {min(cpu_differences):+.0f} to "
        f"{max(cpu_differences):+.0f} ({rounds} rounds)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the other code")
    parser.add_argument("--read-ms", type=float, default=10.0, help="the stand-in's")
    parser.add_argument(
        "--token-ms",
        type=float,
        default=0.0,
        help="the stand-in reports timings as if each evaluated token took this long, so "
        "that the proxy estimates each decision's cost for admission (default: no timings)",
    )
    parser.add_argument("--llama", action="store_true", help="llama-server, not the stand-in")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--requests", type=int, default=150, help="per proxy and round")
    args = parser.parse_args()
    if not (args.before / "proxy" / "__main__.py").is_file():
        parser.error(f"--before: no proxy in {args.before}")
    print(describe())
    server = (
        llama_server_process()
        if args.llama
        else standin_process(read_ms=args.read_ms, token_ms=args.token_ms)
    )
    with (
        server as (upstream, _),
        proxy_process(upstream) as (now, now_process),
        before_proxy(upstream, args.before.resolve()) as (before, before_process),
    ):
        httpx.post(before + PATH, content=PROXY_BODY, headers=HEADERS, timeout=60)
        time.sleep(3)  # the first decision's background work (a self-check) done
        print(
            "llama-server; concurrency 1"
            if args.llama
            else f"stand-in answering /completion after {args.read_ms:g} ms"
            + (f", timings of {args.token_ms:g} ms a token" if args.token_ms else "")
            + "; concurrency 1"
        )
        asyncio.run(
            compare(
                {"now": now + PATH, "before": before + PATH},
                {"now": now_process.pid, "before": before_process.pid},
                args.rounds,
                args.requests,
            )
        )


if __name__ == "__main__":
    main()
