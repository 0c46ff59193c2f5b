"""The proxy's own CPU per decision, with warm and with evicted caches, beside the bare hop's.

    .venv/bin/python bench/cpu_path.py [--decisions 2000] [--rounds 10] [--evict-mb MB]

No socket on the measured path: each request goes into a front connection
(proxy/front_http.py) or bench/_relay.py's hop through a recording transport,
and the upstream pool answers with an answer recorded from the real
llama-server at start (labels are verified against it too), through the event
loop as a real read resumes a decision. What is timed is the thread's CPU time
(user and system; with no socket on the path, nearly all of it user) over
rounds of decisions: the Python a decision runs, its JSON, its readout, and the
event loop's steps between.

Each target is timed warm (decisions back to back) and cold: while each
decision waits for its read, as many bytes as the model file holds (or
``--evict-mb``) are read, untimed, as llama-server's forward pass reads the
model's weights (this machine's L3 holds 32 MiB, the default model 94 MiB), so
the answer's half of the decision runs on what the forward pass left in the
caches. Targets and ways take turns in rounds whose order rotates.

Why: at concurrency 8 the proxy takes CPU that llama-server would compute
with (bench/overhead.py's throughput ratio). Measured over whole processes
(utime in /proc/PID/stat at concurrency 8) the proxy spends about 290 µs of
user CPU per decision and the bare hop about 130; this shows how much of that
difference is the proxy's own Python and how much the cold caches multiply it.
The warm figure is steady to about a microsecond, fine enough to judge a change
to the proxy's path that bench/overhead.py cannot resolve; the cold one moves by
10-20% between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import orjson
import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _relay import _Hop  # noqa: E402
from _servers import llama_server, model_path  # noqa: E402
from overhead import PATH, PROXY_BODY, rotated  # noqa: E402

from proxy.app import create_app  # noqa: E402
from proxy.app_keys import UPSTREAM  # noqa: E402
from proxy.config import Settings  # noqa: E402
from proxy.front import Front  # noqa: E402
from proxy.http1 import Response  # noqa: E402

_HEAD = (b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\n\r\n")
PROXY_REQUEST = _HEAD % (PATH.encode(), len(PROXY_BODY)) + PROXY_BODY
HOP_REQUEST = _HEAD % (PATH.encode(), 2) + b"{}"
_OK = b"HTTP/1.1 200 "

Decision = Callable[[], Awaitable[None]]


class Recording:
    """A transport that counts the 200s written, keeps the last answer and wakes
    whoever waits for the next one."""

    def __init__(self) -> None:
        self.ok = 0
        self.last = b""
        self.waiter: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        self.ok += data.startswith(_OK)
        self.last = data
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def fail(self, context: dict[str, Any]) -> None:
        """A task died unanswered: whoever waits fails instead of waiting forever."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(RuntimeError(context.get("message", "a task failed")))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...

    def get_write_buffer_size(self) -> int:
        return 0


class Replay:
    """The upstream pool's ``request`` once the answer is recorded: that answer,
    after a trip through the event loop, with the weights read first (untimed)
    when ``cold``."""

    def __init__(self, answer: Response, weights: bytes) -> None:
        self.answer, self.weights = answer, weights
        self.cold = False
        self.untimed = 0.0  # CPU seconds spent reading the weights

    async def __call__(self, *args: Any, **kwargs: Any) -> Response:
        if self.cold:
            started = time.thread_time()
            self.weights.find(0)  # no zero byte in it: every page is read
            self.untimed += time.thread_time() - started
        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        loop.call_soon(answered.set_result, self.answer)
        return await answered


def deciding(protocol: Any, out: Recording, request: bytes) -> Decision:
    """One decision: ``request`` fed to ``protocol``, its answer awaited, then one
    more loop step for what is recorded after the answer (metrics)."""
    async def once() -> None:
        out.waiter = asyncio.get_running_loop().create_future()
        protocol.data_received(request)
        await out.waiter
        await asyncio.sleep(0)

    return once


async def targets(llama_url: str, stack: AsyncExitStack, weights: bytes
                  ) -> tuple[dict[str, Decision], dict[str, Recording], Replay]:
    """A decision through the proxy's front and one through the hop, both answered
    by one read recorded from llama-server."""
    app = create_app(Settings(upstream_url=llama_url))
    runner = web.AppRunner(app)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    outs = {"proxy": Recording(), "hop": Recording()}
    conn = Front(app, runner.server)()
    conn.connection_made(outs["proxy"])
    pool = app[UPSTREAM]._pool
    real, recorded = pool.request, []

    async def record(*args: Any, **kwargs: Any) -> Response:
        recorded.append(await real(*args, **kwargs))
        return recorded[-1]

    pool.request = record
    proxy_once = deciding(conn, outs["proxy"], PROXY_REQUEST)
    await proxy_once()  # the real read: labels verified, the answer recorded
    body = orjson.loads(outs["proxy"].last.split(b"\r\n\r\n", 1)[1])
    assert body["semif"]["reads"] == 1, "the recorded read did not cover every label"
    pool.request = replay = Replay(recorded[-1], weights)
    hop = _Hop(pool, b"{}")
    hop.connection_made(outs["hop"])
    return {"proxy": proxy_once, "hop": deciding(hop, outs["hop"], HOP_REQUEST)}, outs, replay


async def measure(llama_url: str, decisions: int, evict_bytes: int, rounds: int
                  ) -> dict[tuple[str, bool], list[float]]:
    """Each (target, cold)'s CPU microseconds per decision, one figure per round."""
    weights = b"\x01" * evict_bytes
    async with AsyncExitStack() as stack:
        once, outs, replay = await targets(llama_url, stack, weights)

        def failed(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            for out in outs.values():
                out.fail(context)

        asyncio.get_running_loop().set_exception_handler(failed)
        for name, run in once.items():  # warm every path
            for _ in range(100):
                await run()
        ways = [(name, cold) for name in once for cold in (False, True)]
        results: dict[tuple[str, bool], list[float]] = {way: [] for way in ways}
        per_round = max(1, decisions // rounds)
        for i in range(rounds):
            for name, cold in rotated(ways, i):
                run, out = once[name], outs[name]
                replay.cold, replay.untimed, ok = cold, 0.0, out.ok
                started = time.thread_time()
                for _ in range(per_round):
                    await run()
                spent = time.thread_time() - started - replay.untimed
                assert out.ok - ok == per_round, f"{name}: not every answer was a 200"
                results[(name, cold)].append(spent / per_round * 1e6)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2000, help="per target and way")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--evict-mb", type=float, default=None,
                        help="MiB read during each cold decision (default: the model file's size)")
    args = parser.parse_args()
    evict = int(args.evict_mb * 2**20) if args.evict_mb else model_path().stat().st_size
    with llama_server() as llama_url:
        results = uvloop.run(measure(llama_url, args.decisions, evict, args.rounds))
    per_round = max(1, args.decisions // args.rounds)
    print(f"CPU µs per decision, median of {args.rounds} rounds of {per_round} "
          f"(cold: {evict / 2**20:.0f} MiB read while each waits for its read)")
    print(f"  {'':10}{'warm':>10}{'cold':>10}{'cold/warm':>12}")
    rows = {name: [statistics.median(results[(name, cold)]) for cold in (False, True)]
            for name in ("proxy", "hop")}
    for name, (warm, cold) in rows.items():
        print(f"  {name:10}{warm:10.1f}{cold:10.1f}{cold / warm:12.2f}")
    (pw, pc), (hw, hc) = rows["proxy"], rows["hop"]
    print(f"  {'proxy-hop':10}{pw - hw:10.1f}{pc - hc:10.1f}")
    print(f"  {'proxy/hop':10}{pw / hw:10.2f}{pc / hc:10.2f}")


if __name__ == "__main__":
    main()
