"""Start the servers a benchmark measures, the same way `make run` does."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.prepare import ensure_llama_server, ensure_model  # noqa: E402
from scripts.stack import start_llama_server, start_proxy, stop, wait_ready  # noqa: E402

__all__ = ["free_port", "llama_server", "proxy", "proxy_process", "ROOT"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(binary: Path | None = None, extra: list[str] | None = None) -> Iterator[str]:
    binary = binary or Path(os.environ.get("LLAMA_SERVER") or ensure_llama_server())
    model = Path(os.environ.get("MODEL") or ensure_model())
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = start_llama_server(binary, model, port, extra, log=log)
        try:
            wait_ready(f"http://127.0.0.1:{port}/health", proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(proc)


@contextlib.contextmanager
def proxy_process(upstream_url: str, extra: list[str] | None = None
                  ) -> Iterator[tuple[str, subprocess.Popen]]:
    """The proxy's URL and its process (for its PID: RSS, /proc)."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = start_proxy(port, upstream_url, extra, log=log)
        try:
            wait_ready(f"http://127.0.0.1:{port}/health", proc, timeout_s=30)
            yield f"http://127.0.0.1:{port}", proc
        finally:
            stop(proc)


@contextlib.contextmanager
def proxy(upstream_url: str, extra: list[str] | None = None) -> Iterator[str]:
    with proxy_process(upstream_url, extra) as (url, _):
        yield url
