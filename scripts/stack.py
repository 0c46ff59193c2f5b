"""``make run``'s supervisor of llama-server and the proxy (the single image's is
supervisord, docs/operations.md: "Which process supervises which"); the tests start
either alone with its functions.

    python scripts/stack.py        # both in the foreground; Ctrl-C stops both

It keeps both up as supervisord does in the single image and the orchestrator's
restart policy with two images: a process that dies is reported in words
(``probe.explain_exit``) and started again after a back-off (1, 2, 4, 8, 16 s);
after six crashes in a row, each within a minute of its start, it gives up with a
message. While
llama-server is down the proxy answers 503 with ``Retry-After``.

Environment: ``PROXY_PORT`` (8080), ``LLAMA_PORT`` (8081), ``MODEL`` (a .gguf;
default SmolLM2-135M-Instruct, fetched once), ``LLAMA_SERVER`` (an existing
binary; default the build chosen for this CPU by ``prepare.py``), ``GPU=1``
(a GPU-capable build, the model offloaded), ``LLAMA_ARGS`` (extra flags).
"""

from __future__ import annotations

import collections
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.choose import NoBuildRuns  # noqa: E402
from scripts.cpu import level, read_cpu  # noqa: E402
from scripts.prepare import choose_llama_server, ensure_model, gpu_requested  # noqa: E402
from scripts.probe import explain_exit, log_tail, offloaded_layers  # noqa: E402

__all__ = [
    "CONNECTIONS",
    "HTTP_THREADS",
    "LLAMA_FLAGS",
    "SLOTS",
    "UBATCH",
    "ServerExited",
    "Supervised",
    "answers",
    "file_tail",
    "llama_exit_reason",
    "start_llama_server",
    "start_proxy",
    "stop",
    "wait_ready",
]

# 4 slots with 8192 tokens each: room for 255 options, concurrent decisions and
# prompt-cache reuse per slot; physical batches of 63 tokens, so that any prefix a slot
# holds reads as a cold one would (docs/repeatability.md); no host-memory prompt cache,
# which would move saved states between slots under the proxy's reads; --metrics so
# Prometheus can scrape llama-server too. HTTP threads for two calls per slot (one
# running, one waiting in llama-server's queue to start in the next batch), the proxy's
# 2 rendering and tokenising calls, its health check and one for a person's curl; the
# proxy is told to use all but that one (``CONNECTIONS``; docs/operations.md).
UBATCH = 63
# The proxy is ready once its repeatability self-check has settled: at most 600 s
# (proxy/checking.py CHECK_BOUND_S; about 3 minutes for a 1B model on 2 cores, seconds once
# its verdict is kept), plus its start.
PROXY_READY_S = 660.0
SLOTS = 4
HTTP_THREADS = 2 * SLOTS + 4
CONNECTIONS = HTTP_THREADS - 1
LLAMA_FLAGS = [
    *("-np", str(SLOTS), "-c", "32768", "-ub", str(UBATCH), "-cram", "0", "--metrics"),
    *("--threads-http", str(HTTP_THREADS)),
]
ROOT = Path(__file__).resolve().parent.parent
_BACKOFF_S = (1, 2, 4, 8, 16)
_STABLE_S = 60.0  # a process up this long has recovered: its crash count starts again


try:  # bound here, in the parent: the child runs nothing but the call itself
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: be sent SIGTERM when the process that started us dies (Linux
    ``PR_SET_PDEATHSIG``), so a killed test run or ``make run`` leaves nothing behind."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerExited(RuntimeError):
    """A process exited before it was ready; the message says what happened and what to do."""


def start_llama_server(
    binary: Path, model: Path, port: int, extra: list[str] | None = None, log=None
) -> subprocess.Popen:
    """llama-server on ``model``, served under the GGUF's stem as its model id (``--alias``),
    so ``/v1/models`` does not show the machine's file paths."""
    env = dict(os.environ)
    libdir = str(Path(binary).parent)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
    cmd = [
        str(binary),
        "-m",
        str(model),
        "--alias",
        Path(model).stem,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *LLAMA_FLAGS,
        *(extra or []),
    ]
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT if log else None,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def start_proxy(
    port: int,
    upstream_url: str,
    extra: list[str] | None = None,
    log=None,
    env: dict[str, str] | None = None,
    ubatch: int | None = None,
    connections: int | None = None,
    cwd: Path = ROOT,
) -> subprocess.Popen:
    """The proxy in front of ``upstream_url``; ``ubatch``: that llama-server's ``-ub``
    (``UBATCH`` for one started by ``start_llama_server``), told to the proxy;
    ``connections``: the calls it may have in flight there (``CONNECTIONS`` for one
    started by ``start_llama_server``), unless ``extra`` says; ``cwd``: the checkout whose
    proxy runs (this one by default)."""
    told = any(a.startswith("--max-connections") for a in extra or [])
    cmd = [
        sys.executable,
        "-m",
        "proxy",
        "--port",
        str(port),
        "--upstream-url",
        upstream_url,
        *(["--upstream-ubatch", str(ubatch)] if ubatch else []),
        *(["--max-connections", str(connections)] if connections and not told else []),
        *(extra or []),
    ]
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT if log else None,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def file_tail(path: str | Path, limit: int = 64 * 1024) -> str:
    """The end of a log file (empty when unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def llama_exit_reason(log: Callable[[], str]) -> Callable[[int], str]:
    """A ``why`` for ``wait_ready``: a llama-server exit explained with this CPU's level."""
    return lambda rc: explain_exit(rc, log(), has=level(read_cpu()))


def answers(url: str, timeout_s: float) -> bool:
    """Whether ``url`` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(
    url: str,
    proc: subprocess.Popen,
    timeout_s: float = 180.0,
    *,
    why: Callable[[int], str] | None = None,
) -> None:
    """Poll ``url`` until it answers 200; raise ``ServerExited`` with ``why(returncode)``
    at once if ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            rc = proc.returncode
            name = Path(str(proc.args[0])).name
            raise ServerExited(why(rc) if why else f"{name} exited with {rc} before it was ready")
        if answers(url, timeout_s=2):
            return
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


class Supervised:
    """One process kept running: its output echoed and its last lines kept for the message
    that explains an exit; restarted with back-off until it crashes too often."""

    def __init__(
        self,
        name: str,
        start: Callable[..., subprocess.Popen],
        ready_url: str,
        explain: Callable[[int, str], str],
        ready_timeout_s: float = 180.0,
    ):
        self.name, self._start, self.ready_url = name, start, ready_url
        self._explain, self._ready_timeout_s = explain, ready_timeout_s
        self._tail: collections.deque[str] = collections.deque(maxlen=40)
        self.proc: subprocess.Popen | None = None
        self._echoing: threading.Thread | None = None
        self._offload_line = ""
        self.started_at = 0.0
        self.crashes = 0
        self.answering = False

    def start(self) -> None:
        self._tail.clear()
        self.answering = False
        self.proc = self._start(log=subprocess.PIPE)
        self.started_at = time.monotonic()
        self._echoing = threading.Thread(target=self._echo, args=(self.proc,), daemon=True)
        self._echoing.start()

    def _echo(self, proc: subprocess.Popen) -> None:
        with proc.stdout:
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                self._tail.append(line)
                if "layers to GPU" in line:  # printed while loading, long before it is ready
                    self._offload_line = line
                sys.stdout.write(line)
        sys.stdout.flush()

    def wait_ready(self) -> None:
        wait_ready(self.ready_url, self.proc, self._ready_timeout_s, why=self.reason)
        self.answering = True

    def reason(self, returncode: int) -> str:
        self.proc.wait()
        self._echoing.join(5)  # the last lines, up to the end of its output
        return self._explain(returncode, "".join(self._tail))

    def offloaded_layers(self) -> int:
        """Layers llama-server reported offloaded to a GPU in its output so far."""
        return offloaded_layers(self._offload_line)

    def back_up(self) -> bool:
        """True once, when a restarted process answers its ready URL again."""
        if self.answering or self.proc is None or self.proc.poll() is not None:
            return False
        self.answering = answers(self.ready_url, timeout_s=1)
        return self.answering

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def restart_after_exit(self, say: Callable[[str], None]) -> None:
        """Report the exit and start again after the back-off; raise ``ServerExited``
        once it has crashed six times in a row, each soon after its start."""
        say(f"{self.name} stopped: {self.reason(self.proc.returncode)}")
        self.crashes = 1 if time.monotonic() - self.started_at > _STABLE_S else self.crashes + 1
        if self.crashes > len(_BACKOFF_S):
            raise ServerExited(
                f"{self.name} crashed {self.crashes} times in a row, each "
                f"within {_STABLE_S:.0f}s of its start; giving up"
            )
        delay = _BACKOFF_S[self.crashes - 1]
        say(
            f"starting {self.name} again in {delay}s ({self.crashes} of "
            f"{len(_BACKOFF_S)} quick restarts)"
        )
        time.sleep(delay)
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def _say(msg: str) -> None:
    print(f"[run] {msg}", flush=True)


def _llama_binary(model: Path) -> tuple[Path, list[str], str]:
    """The llama-server to run, the flags its choice needs, and what to call it."""
    if os.environ.get("LLAMA_SERVER"):
        path = Path(os.environ["LLAMA_SERVER"])
        return path, [], f"{path} (LLAMA_SERVER, not probed)"
    choice = choose_llama_server(gpu=gpu_requested(), model=model)
    return Path(choice.binary), choice.args, choice.summary()


def main() -> int:
    started = time.monotonic()
    proxy_port = int(os.environ.get("PROXY_PORT") or 8080)
    llama_port = int(os.environ.get("LLAMA_PORT") or 8081)
    model = Path(os.environ.get("MODEL") or ensure_model())
    if not model.exists():
        _say(f"the model file {model} does not exist")
        return 1
    try:
        binary, choice_args, described = _llama_binary(model)
    except NoBuildRuns as err:
        _say(str(err))
        return 1
    if not binary.exists():
        _say(f"LLAMA_SERVER={binary} does not exist")
        return 1
    _say(f"llama-server: {described}\n[run] model {model}")
    extra = [*choice_args, *shlex.split(os.environ.get("LLAMA_ARGS", ""))]
    has = level(read_cpu())
    llama = Supervised(
        "llama-server",
        lambda log: start_llama_server(binary, model, llama_port, extra, log=log),
        f"http://127.0.0.1:{llama_port}/health",
        lambda rc, log: explain_exit(rc, log, has=has),
    )
    proxy = Supervised(
        "the proxy",
        lambda log: start_proxy(
            proxy_port,
            f"http://127.0.0.1:{llama_port}",
            log=log,
            ubatch=UBATCH,
            connections=CONNECTIONS,
        ),
        f"http://127.0.0.1:{proxy_port}/health",
        lambda rc, log: f"exited with {rc}; its output ends:\n{log_tail(log)}",
        PROXY_READY_S,
    )
    children = [llama, proxy]
    try:
        for child in children:
            child.start()
            if child is proxy:
                _say(
                    "the proxy checks that its reads repeat bit for bit before it says ready: "
                    "about 1,300 prompt tokens the first time, then the verdict is kept"
                )
            child.wait_ready()
        if "-ngl" in choice_args and not llama.offloaded_layers():
            _say(
                "warning: GPU=1, but llama-server offloaded no layers to a GPU; it runs on "
                "the CPU (run `GPU=1 python scripts/prepare.py llama-server --reprobe`)"
            )
        _say(
            f"ready in {time.monotonic() - started:.0f}s: proxy http://127.0.0.1:{proxy_port}"
            f" -> llama-server http://127.0.0.1:{llama_port} (Ctrl-C stops both)"
        )
        while True:
            for child in children:
                if child.exited():
                    child.restart_after_exit(_say)
                elif child.back_up():
                    _say(
                        f"{child.name} is answering again "
                        f"({time.monotonic() - child.started_at:.1f}s after its restart)"
                    )
            time.sleep(0.5)
    except KeyboardInterrupt:
        print(flush=True)
        _say("stopping")
        return 0
    except ServerExited as err:
        _say(str(err))
        return 1
    finally:
        for child in reversed(children):
            child.stop()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    # Ctrl-C and SIGTERM both stop the pair (also when started with SIGINT ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(main())
