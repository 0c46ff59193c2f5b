"""Start the servers a benchmark measures, the same way `make run` does."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.prepare import ensure_llama_server, ensure_model  # noqa: E402
from scripts.probe import free_port  # noqa: E402
from scripts.stack import (  # noqa: E402
    CONNECTIONS,
    HTTP_THREADS,
    UBATCH,
    start_llama_server,
    start_proxy,
    stop,
    wait_ready,
)

# llama-server's default physical batch, given after make run's -ub 63 (a later flag wins):
# the segment scheme's server (bench/fresh.py, bench/shared_state.py --segment)
STOCK = ["-ub", "512"]

# llama-server flags for a benchmark whose own clients (direct reads, the chat endpoint, a
# bare relay) talk to llama-server beside the proxy, up to 8 connections each at
# concurrency 8. `make run`'s HTTP threads are sized for the proxy alone; past them a new
# connection now and then waits for an idle keep-alive one to time out (cpp-httplib: 5 s),
# which halves a start's throughput at concurrency 8 (docs/performance.md, "Replays before
# and after the prefix scheme").
BESIDE_PROXY = ["--threads-http", str(HTTP_THREADS + 2 * 8)]

__all__ = [
    "BESIDE_PROXY",
    "free_port",
    "model_path",
    "llama_server",
    "llama_server_process",
    "proxy",
    "proxy_process",
    "bare_relay",
    "standin_process",
    "pin",
    "ROOT",
]


@contextlib.contextmanager
def _serving(
    start: Callable[[int, IO[bytes]], subprocess.Popen], timeout_s: float, path: str = "/health"
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start a server on a free port (its output to a temporary log), wait for ``path``
    to answer 200, yield its URL and process, stop it on the way out."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = start(port, log)
        try:
            wait_ready(f"http://127.0.0.1:{port}{path}", proc, timeout_s=timeout_s)
            yield f"http://127.0.0.1:{port}", proc
        finally:
            stop(proc)


def model_path() -> Path:
    """The model the benchmarks serve: ``MODEL``, or the default (fetched if missing)."""
    return Path(os.environ.get("MODEL") or ensure_model())


@contextlib.contextmanager
def llama_server_process(
    binary: Path | None = None, extra: list[str] | None = None, model: Path | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """llama-server as `make run` starts it, on ``model`` (default: ``model_path()``)."""
    binary = binary or Path(os.environ.get("LLAMA_SERVER") or ensure_llama_server())
    model = model or model_path()
    with _serving(
        lambda port, log: start_llama_server(binary, model, port, extra, log=log), timeout_s=180
    ) as served:
        yield served


@contextlib.contextmanager
def llama_server(binary: Path | None = None, extra: list[str] | None = None) -> Iterator[str]:
    with llama_server_process(binary, extra) as (url, _):
        yield url


def pin(pid: int, core: int) -> None:
    """Move every thread of ``pid`` to ``core`` (taskset -a)."""
    subprocess.run(
        ["taskset", "-a", "-cp", str(core), str(pid)], check=True, stdout=subprocess.DEVNULL
    )


@contextlib.contextmanager
def proxy_process(
    upstream_url: str,
    extra: list[str] | None = None,
    ubatch: int | None = UBATCH,
    cwd: Path = ROOT,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """The proxy's URL and its process (for its PID: RSS, /proc); ``ubatch``: the -ub of
    the llama-server before it (``UBATCH``, as ``llama_server`` starts it; None: unknown);
    ``cwd``: the checkout whose proxy runs (this one by default)."""
    with _serving(
        lambda port, log: start_proxy(
            port,
            upstream_url,
            extra,
            log=log,
            ubatch=ubatch,
            connections=ubatch and CONNECTIONS,
            cwd=cwd,
        ),
        timeout_s=30,
        path="/livez",
    ) as served:
        _settle(served[0])
        yield served


def _settle(url: str, timeout_s: float = 900) -> None:
    """Until the proxy is ready: its self-check (proxy/decision/selfcheck.py), a start-up
    cost read with every slot leased that no measurement should include, runs before
    ``/health`` says ok (or is recalled from a kept verdict, proxy/verdicts.py)."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while httpx.get(url + "/health", timeout=60).status_code != 200:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {timeout_s:.0f}s")
        time.sleep(POLL_S)


# Twice a second. Each poll wakes three processes (this one, the proxy, llama-server's
# HTTP thread) beside llama-server's compute threads; measured on 2 cores with the slow
# model, polling at 10 Hz made its reads slower (a throwaway measurement), and
# the self-check's reads teach the cost model (proxy/cost.py) the estimates start from.
POLL_S = 0.5


@contextlib.contextmanager
def bare_relay(upstream_url: str, body: bytes) -> Iterator[tuple[str, subprocess.Popen]]:
    """bench/_relay.py: an aiohttp hop with no decision logic, sending ``body`` upstream."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(body)
        f.flush()
        command = [sys.executable, str(ROOT / "bench" / "_relay.py"), upstream_url]
        with _serving(
            lambda port, log: subprocess.Popen(
                [*command, str(port), f.name],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            ),
            timeout_s=30,
        ) as served:
            yield served


@contextlib.contextmanager
def standin_process(
    slots: int = 8, read_ms: float = 0.0, token_ms: float = 0.0
) -> Iterator[tuple[str, subprocess.Popen]]:
    """tests/standin.py in its own process: llama-server's API with no model, with ``slots``
    slots, answering ``/completion`` after ``read_ms`` (default: at once), with timings as
    if each evaluated token took ``token_ms`` (default: none: the proxy then estimates no
    decision's cost for admission)."""
    command = [sys.executable, "-m", "tests.standin", "--read-ms", str(read_ms)]
    command += ["--token-ms", str(token_ms)]
    with _serving(
        lambda port, log: subprocess.Popen(
            [*command, str(port), "--tokens", "--slots", str(slots)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ),
        timeout_s=30,
    ) as served:
        yield served


@contextlib.contextmanager
def proxy(
    upstream_url: str, extra: list[str] | None = None, ubatch: int | None = UBATCH
) -> Iterator[str]:
    with proxy_process(upstream_url, extra, ubatch) as (url, _):
        yield url
