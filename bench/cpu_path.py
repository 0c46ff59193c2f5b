"""The proxy's own CPU per decision, with warm and with evicted caches, beside the bare hop's.

    .venv/bin/python bench/cpu_path.py [--decisions 2000] [--evict-mb MB]

No socket on the measured path: each request goes into a front connection
(proxy/front_http.py) or bench/_relay.py's hop through a recording transport,
and the upstream pool answers at once with an answer recorded from the real
llama-server at start (labels are verified against it too). What is timed is
the thread's CPU time from the request's bytes to the answer's bytes: the
Python a decision runs, its JSON and its readout, without the kernel's share.

Each target is timed warm (decisions back to back) and cold: before each
decision as many bytes as the model file holds (or ``--evict-mb``) are read,
untimed, as llama-server's forward pass reads the model's weights between two
decisions (this machine's L3 holds 32 MiB, the default model 94 MiB). Targets
and ways take turns in rounds whose order rotates.

Why: at concurrency 8 the proxy takes CPU that llama-server would compute
with (bench/overhead.py's throughput ratio). Measured over whole processes
(utime in /proc at concurrency 8) the proxy spends about 290 µs of user CPU
per decision and the bare hop about 130; this shows how much of that
difference is the proxy's own Python, and how much the cold caches multiply
it, with a figure steady enough to tell a change of a few microseconds (the
end-to-end ratios cannot).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import orjson
import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _relay import _Hop  # noqa: E402
from _servers import llama_server  # noqa: E402
from scripts.prepare import ensure_model  # noqa: E402
from overhead import PATH, PROXY_BODY, rotated  # noqa: E402

from proxy.app import create_app  # noqa: E402
from proxy.app_keys import UPSTREAM  # noqa: E402
from proxy.config import Settings  # noqa: E402
from proxy.front import Front  # noqa: E402

_HEAD = b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
PROXY_REQUEST = _HEAD % (PATH.encode(), len(PROXY_BODY)) + PROXY_BODY
HOP_REQUEST = _HEAD % (PATH.encode(), 2) + b"{}"


class Recording:
    """A transport that keeps the last answer written."""

    def __init__(self) -> None:
        self.answers = 0
        self.last = b""

    def write(self, data: bytes) -> None:
        self.answers += 1
        self.last = data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...

    def get_write_buffer_size(self) -> int:
        return 0


async def targets(llama_url: str, stack: AsyncExitStack
                  ) -> dict[str, Callable[[], Awaitable[None]]]:
    """(name, one decision) for the proxy and the hop; both answer from one recorded read."""
    app = create_app(Settings(upstream_url=llama_url))
    runner = web.AppRunner(app)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    conn, proxy_out = Front(app, runner.server)(), Recording()
    conn.connection_made(proxy_out)

    async def proxy_once() -> None:
        conn.data_received(PROXY_REQUEST)
        await conn.task

    pool = app[UPSTREAM]._pool
    real = pool.request
    recorded = []

    async def record(*args, **kwargs):
        recorded.append(await real(*args, **kwargs))
        return recorded[-1]

    pool.request = record
    await proxy_once()  # the real read: labels verified, the answer recorded
    answer = recorded[-1]

    async def replay(*args, **kwargs):
        return answer

    pool.request = replay
    hop, hop_out = _Hop(pool, b"{}"), Recording()
    hop.connection_made(hop_out)

    async def hop_once() -> None:
        before = hop_out.answers
        hop.data_received(HOP_REQUEST)
        while hop_out.answers == before:  # the hop's task answers on its first step
            await asyncio.sleep(0)

    await proxy_once()
    await hop_once()
    for out in (proxy_out, hop_out):
        assert out.last.startswith(b"HTTP/1.1 200 "), out.last[:80]
    body = orjson.loads(proxy_out.last.split(b"\r\n\r\n", 1)[1])
    assert body["semif"]["reads"] == 1, "the recorded read did not cover every label"
    return {"proxy": proxy_once, "hop": hop_once}


async def measure(llama_url: str, decisions: int, evict_bytes: int, rounds: int = 10):
    """Each (target, way)'s CPU microseconds per decision, one figure per round."""
    async with AsyncExitStack() as stack:
        once = await targets(llama_url, stack)
        weights = b"\x01" * evict_bytes  # real pages (zeros would all map one page)
        ways = [(name, cold) for name in once for cold in (False, True)]
        results: dict[tuple[str, bool], list[float]] = {way: [] for way in ways}
        per_round = max(1, decisions // rounds)
        for i in range(rounds):
            for name, cold in rotated(ways, i):
                run, spent = once[name], 0.0
                for _ in range(per_round):
                    if cold:
                        weights.find(0)  # untimed: read through, as a forward pass reads
                    started = time.thread_time()
                    await run()
                    spent += time.thread_time() - started
                results[(name, cold)].append(spent / per_round * 1e6)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2000, help="per target and way")
    parser.add_argument("--evict-mb", type=float, default=None,
                        help="MiB read before each cold decision (default: the model file's size)")
    args = parser.parse_args()
    model = Path(os.environ.get("MODEL") or ensure_model())
    evict = int(args.evict_mb * 2**20) if args.evict_mb else model.stat().st_size
    with llama_server() as llama_url:
        results = uvloop.run(measure(llama_url, args.decisions, evict))
    print(f"CPU µs per decision, median of 10 rounds ({args.decisions} decisions per target "
          f"and way; cold: {evict / 2**20:.0f} MiB read before each)")
    print(f"  {'':8}{'warm':>10}{'cold':>10}{'cold/warm':>12}")
    rows = {name: [statistics.median(results[(name, cold)]) for cold in (False, True)]
            for name in ("proxy", "hop")}
    for name, (warm, cold) in rows.items():
        print(f"  {name:8}{warm:10.1f}{cold:10.1f}{cold / warm:12.2f}")
    (pw, pc), (hw, hc) = rows["proxy"], rows["hop"]
    print(f"  {'proxy-hop':8}{pw - hw:10.1f}{pc - hc:10.1f}")
    print(f"  {'proxy/hop':8}{pw / hw:10.2f}{pc / hc:10.2f}")


if __name__ == "__main__":
    main()
