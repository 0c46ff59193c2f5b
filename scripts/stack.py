"""Start llama-server and the proxy side by side (``make run``), or either alone (tests).

    python scripts/stack.py        # both in the foreground; Ctrl-C stops both

Environment: ``PROXY_PORT`` (8080), ``LLAMA_PORT`` (8081), ``MODEL`` (a .gguf;
default SmolLM2-135M-Instruct, fetched once), ``LLAMA_SERVER`` (an existing
binary; default the pinned build, fetched once), ``LLAMA_ARGS`` (extra flags).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.prepare import ensure_llama_server, ensure_model  # noqa: E402

__all__ = ["LLAMA_FLAGS", "start_llama_server", "start_proxy", "wait_ready", "stop"]

# 4 slots with 8192 tokens each: room for 255 options, concurrent decisions and
# prompt-cache reuse per slot; --metrics so Prometheus can scrape llama-server too.
LLAMA_FLAGS = ["-np", "4", "-c", "32768", "--metrics"]
ROOT = Path(__file__).resolve().parent.parent


def start_llama_server(
    binary: Path, model: Path, port: int, extra: list[str] | None = None, log=None
) -> subprocess.Popen:
    env = dict(os.environ)
    libdir = str(Path(binary).parent)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           *LLAMA_FLAGS, *(extra or [])]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT if log else None,
                            start_new_session=True)


def start_proxy(port: int, upstream_url: str, extra: list[str] | None = None, log=None,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "proxy", "--port", str(port), "--upstream-url", upstream_url,
           *(extra or [])]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT if log else None, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f}s")


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    started = time.monotonic()
    proxy_port = int(os.environ.get("PROXY_PORT") or 8080)
    llama_port = int(os.environ.get("LLAMA_PORT") or 8081)
    binary = Path(os.environ.get("LLAMA_SERVER") or ensure_llama_server())
    model = Path(os.environ.get("MODEL") or ensure_model())
    for path in (binary, model):
        if not path.exists():
            raise SystemExit(f"not found: {path}")
    print(f"[run] llama-server {binary}\n[run] model {model}", flush=True)
    llama = start_llama_server(binary, model, llama_port, shlex.split(os.environ.get("LLAMA_ARGS", "")))
    procs = [llama]
    try:
        wait_ready(f"http://127.0.0.1:{llama_port}/health", llama)
        proxy = start_proxy(proxy_port, f"http://127.0.0.1:{llama_port}")
        procs.append(proxy)
        wait_ready(f"http://127.0.0.1:{proxy_port}/health", proxy, timeout_s=30)
        print(f"[run] ready in {time.monotonic() - started:.0f}s: proxy http://127.0.0.1:{proxy_port}"
              f" -> llama-server http://127.0.0.1:{llama_port} (Ctrl-C stops both)", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return next(p.returncode for p in procs if p.poll() is not None) or 1
    except KeyboardInterrupt:
        print("\n[run] stopping", flush=True)
        return 0
    finally:
        for proc in reversed(procs):
            stop(proc)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    # Ctrl-C and SIGTERM both stop the pair (also when started with SIGINT ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(main())
