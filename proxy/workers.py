"""``python -m proxy --workers N``: N processes serving one port.

Role: the proxy's own supervisor of its workers, beneath whichever keeps the proxy
running (docs/operations.md, "Which process supervises which").

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
and answers the sum (``peers.py``, ``metrics.merged``), so the port shows the whole proxy
whichever worker answers. ``semif_worker_processes`` says how many answered.

The parent only starts the workers (``multiprocessing``, spawned), starts a
worker again when one dies after it has served (at once; after a back-off of 1 to
30 s while it keeps dying before it is ready), stops everything when a worker
dies before it was ever ready (a port in use, say: exit 1), and on SIGTERM or
SIGINT passes SIGTERM on and waits for the workers to drain.

Decision records (``--decision-records stdout`` or a file; ``proxy/record_sink.py``): one
writer for the whole proxy, here in the parent. Each worker queues its records (bounded,
``--decision-records-buffer``) and its writer thread sends whole batches of lines over a
pipe of its own to the parent; the parent's relay thread takes one batch at a time and
writes it to stdout or the file before taking the next. So a record of several kilobytes
never interleaves with another worker's (a pipe keeps only writes of up to 4 KB whole, and
stdout to a container runtime is a pipe). A slow sink blocks the relay, the pipes fill,
and the workers' queues drop what does not fit (counted in
``semif_decision_records_dropped_total``, summed over the workers like every count). The
prompt hashes' random key, when no key file is given, is made here once and handed to
every worker, so that their hashes compare. Records in the answer (``answer``) need no
relay.

A worker's counts start again from zero when it is started again: the summed
counters then go down, which Prometheus reads as a counter reset, so ``rate()``
over a window that holds a worker's restart overstates. A scrape while a worker
does not answer gets 503 rather than a partial sum.
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

from aiohttp import web

from .config import Settings
from .record_sink import Relay, sink_writer
from .records import ANSWER, OFF, record_key

__all__ = ["run", "share"]

log = logging.getLogger("proxy")
_BACKOFF_S = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # by deaths in a row before ready again


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

    ready = [context.Event() for _ in range(n)]
    mode = settings.decision_records
    key = record_key(settings) if mode != OFF else None
    relay = Relay(*sink_writer(mode)) if mode not in (OFF, ANSWER) else None

    def start(i: int) -> multiprocessing.process.BaseProcess:
        ready[i].clear()
        receive, send = context.Pipe(duplex=False) if relay is not None else (None, None)
        proc = context.Process(
            target=_worker,
            args=(settings, i, sockets, ready[i], send, key),
            name=f"worker-{i}",
        )
        proc.start()
        if relay is not None and receive is not None and send is not None:
            send.close()  # the worker holds its own copy: its end closes when it exits
            relay.add(receive)
        return proc

    procs: list[multiprocessing.process.BaseProcess | None] = [start(i) for i in range(n)]
    served = [False] * n  # whether worker i has ever been ready
    failures = [0] * n  # deaths in a row before it was ready again
    restart_at: dict[int, float] = {}
    code = 0
    try:
        while not stopping:
            alive = [p.sentinel for p in procs if p is not None]
            ended = multiprocessing.connection.wait(alive, timeout=0.5) if alive else []
            for i, proc in enumerate(procs):
                if proc is None or proc.sentinel not in ended or stopping:
                    continue
                proc.join()
                was_ready = ready[i].is_set()
                served[i] = served[i] or was_ready
                if not served[i]:  # never served: a port in use, a bad setting
                    log.error(
                        "worker %d exited with %s before it was ready: stopping", i, proc.exitcode
                    )
                    stopping, code = True, 1
                    break
                failures[i] = 0 if was_ready else failures[i] + 1
                delay = _BACKOFF_S[min(failures[i], len(_BACKOFF_S) - 1)]
                log.warning(
                    "worker %d (pid %s) exited with %s: starting it again in %g s",
                    i,
                    proc.pid,
                    proc.exitcode,
                    delay,
                )
                procs[i], restart_at[i] = None, time.monotonic() + delay
            for i, when in list(restart_at.items()):
                if not stopping and time.monotonic() >= when:
                    del restart_at[i]
                    procs[i] = start(i)
    finally:
        running = [proc for proc in procs if proc is not None]
        for proc in running:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + settings.shutdown_timeout_s + 5
        for proc in running:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        if relay is not None:  # what the workers sent before they ended, written
            relay.close()
        shutil.rmtree(folder, ignore_errors=True)
    return code


def _worker(
    settings: Settings,
    index: int,
    sockets: list[str],
    ready,
    records: multiprocessing.connection.Connection | None = None,
    key: bytes | None = None,
) -> None:
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
        # the calls in flight to llama-server, when fixed, are shared too (its HTTP threads)
        max_connections=(
            share(settings.max_connections, n, index, least=3) if settings.max_connections else 0
        ),
    )
    app = create_app(
        mine,
        worker=(index, n),
        check_lock=Path(sockets[index]).parent / "self-check.lock",
        records_to=records.send_bytes if records is not None else None,
        records_key=key,
    )
    app[PEERS] = tuple(s for i, s in enumerate(sockets) if i != index)

    async def main() -> None:
        private = web.Application()

        async def own(_request: web.Request) -> web.Response:
            return web.Response(body=app[METRICS].render())

        private.router.add_get("/metrics", own)
        runner = web.AppRunner(private, handle_signals=False, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, sockets[index]).start()
        log.info(
            "worker %d of %d (pid %d): %d decisions at once, %d queued",
            index,
            n,
            os.getpid(),
            mine.max_active_decisions,
            mine.max_queued_decisions,
        )
        await serve(app, mine, reuse_port=True, beside=runner, on_ready=ready.set)

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main())


def _die_with_parent() -> None:
    """A worker gets SIGTERM when the parent dies, whatever killed it (Linux)."""
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before the call: nobody would tell us
            os.kill(os.getpid(), signal.SIGTERM)
