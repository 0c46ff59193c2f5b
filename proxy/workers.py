"""``python -m proxy --workers N``: N processes serving one port.

Each worker is a whole proxy (its own event loop, llama-server connections,
admission and metrics) listening on the port with ``SO_REUSEPORT``. The kernel
spreads *connections* over the workers, not requests: a client that keeps one
connection alive is served by one worker for as long as it keeps it, so the
load spreads only across clients (or connections), as with any pre-fork server.

Admission is per worker. Worker ``i`` admits its ``share`` of
``PROXY_MAX_ACTIVE`` and ``PROXY_MAX_QUEUED``, so together the workers admit
what one process would, and each estimates the queue it can see: its own. The
``semif_decisions_active`` and ``semif_decisions_queued`` gauges are each
worker's counts, summed across workers at scrape time, so the figure is the
proxy's whole queue; a 429 is decided on the worker's own.

Metrics: each worker keeps its own registry and serves it on a Unix socket in a
private folder; the worker a scrape of ``/metrics`` lands on reads the others'
and answers the sum (``metrics.merged``), so the port shows the whole proxy
whichever worker answers. ``semif_worker_processes`` says how many answered.

The parent only starts the workers (``multiprocessing``, spawned), starts a
worker again when one dies after it was serving, stops everything when one dies
at start (a port in use, say: exit 1), and on SIGTERM or SIGINT passes SIGTERM
on and waits for the workers to drain.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
from aiohttp import web

from .config import Settings

__all__ = ["run", "share", "peer_metrics"]

log = logging.getLogger("proxy")
_STEADY_S = 5.0  # a worker that dies sooner after its start is not started again
_PEER_TIMEOUT_S = 2.0


def share(total: int, workers: int, index: int, *, least: int = 0) -> int:
    """Worker ``index``'s part of ``total`` split over ``workers``: ``total // workers``,
    one more for the first ``total % workers``, and at least ``least``."""
    return max(least, total // workers + (1 if index < total % workers else 0))


def run(settings: Settings) -> int:
    """Start ``settings.workers`` workers and supervise them until SIGTERM or SIGINT."""
    n = settings.workers
    folder = Path(tempfile.mkdtemp(prefix="semif-workers-"))
    sockets = [str(folder / f"worker-{i}.sock") for i in range(n)]
    context = multiprocessing.get_context("spawn")
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def start(i: int) -> multiprocessing.process.BaseProcess:
        proc = context.Process(target=_worker, args=(settings, i, sockets), name=f"worker-{i}")
        proc.start()
        return proc

    procs = [start(i) for i in range(n)]
    since = [time.monotonic()] * n
    code = 0
    try:
        while not stopping:
            ended = multiprocessing.connection.wait([p.sentinel for p in procs], timeout=0.5)
            for i, proc in enumerate(procs):
                if proc.sentinel not in ended or stopping:
                    continue
                proc.join()
                if time.monotonic() - since[i] < _STEADY_S:
                    log.error("worker %d exited with %s within %g s of its start: stopping",
                              i, proc.exitcode, _STEADY_S)
                    stopping, code = True, 1
                    break
                log.warning("worker %d (pid %s) exited with %s: starting it again",
                            i, proc.pid, proc.exitcode)
                procs[i], since[i] = start(i), time.monotonic()
    finally:
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + settings.shutdown_timeout_s + 5
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        shutil.rmtree(folder, ignore_errors=True)
    return code


def _worker(settings: Settings, index: int, sockets: list[str]) -> None:
    from .app import create_app
    from .app_keys import METRICS, PEERS
    from .logs import setup_logging
    from .server import loop_factory, serve

    _die_with_parent()
    setup_logging(f" w{index}")
    n = settings.workers
    mine = replace(
        settings,
        max_active_decisions=share(settings.max_active_decisions, n, index, least=1),
        max_queued_decisions=share(settings.max_queued_decisions, n, index),
    )
    app = create_app(mine, worker=(index, n))
    app[PEERS] = tuple(s for i, s in enumerate(sockets) if i != index)

    async def main() -> None:
        private = web.Application()

        async def own(_request: web.Request) -> web.Response:
            return web.Response(body=app[METRICS].render())

        private.router.add_get("/metrics", own)
        runner = web.AppRunner(private, handle_signals=False, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, sockets[index]).start()
        log.info("worker %d of %d (pid %d): %d decisions at once, %d queued", index, n,
                 os.getpid(), mine.max_active_decisions, mine.max_queued_decisions)
        await serve(app, mine, reuse_port=True, beside=runner)

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main())


async def peer_metrics(sockets: tuple[str, ...]) -> list[str]:
    """The other workers' expositions; a worker that does not answer (it is starting
    again) is left out, and ``semif_worker_processes`` shows it."""
    async def one(path: str) -> str | None:
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path),
                timeout=aiohttp.ClientTimeout(total=_PEER_TIMEOUT_S),
            ) as session, session.get("http://worker/metrics") as resp:
                return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.warning("worker metrics at %s not read: %s", path, exc)
            return None

    found = await asyncio.gather(*(one(path) for path in sockets))
    return [text for text in found if text is not None]


def _die_with_parent() -> None:
    """A worker gets SIGTERM when the parent dies, whatever killed it (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
