"""Shared fixtures: the real llama-server (once per session) and the real proxy."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from scripts.prepare import ensure_llama_server, ensure_model
from scripts.probe import free_port
from scripts.slow_model import ensure_slow_model
from scripts.stack import (
    CONNECTIONS,
    UBATCH,
    file_tail,
    llama_exit_reason,
    start_llama_server,
    start_proxy,
    stop,
    wait_ready,
)

# The proxies the tests start keep their self-check verdicts in one file of this session's,
# not in the user's ~/.cache (proxy/verdicts.py): the first proxy before a llama-server
# reads the check, the next ones recall it. A test of the check names a file of its own.
VERDICTS = Path(tempfile.mkdtemp(prefix="semif-test-verdicts-")) / "self-check.json"
os.environ["PROXY_CHECK_VERDICTS"] = str(VERDICTS)

READY_S = 660  # a proxy's self-check before ready, 600 s at most (proxy/checking.py)
SLOTS_TIMEOUT_S = 120  # a whole batch of a long prompt on the slowest CPU seen

__all__ = [
    "LlamaServer",
    "free_port",
    "launch_llama",
    "launch_proxy",
    "slow_model",
    "wait_for_self_check",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--containers",
        action="store_true",
        help="collect the container suite, tests/containers (make test-containers)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/containers runs only when asked (make test-containers): it needs a Docker
    engine, and builds and starts images."""
    if collection_path == Path(__file__).parent / "containers":
        return not config.getoption("containers")
    return None


@dataclass(frozen=True)
class LlamaServer:
    url: str
    port: int
    binary: Path
    model: Path

    def busy_slots(self) -> int:
        # llama-server answers /slots only between batches: a 1,500-token prompt in one
        # batch holds it for seconds on a slow CPU, so wait as long as a batch can take
        resp = httpx.get(self.url + "/slots", timeout=SLOTS_TIMEOUT_S)
        return sum(1 for slot in resp.json() if slot.get("is_processing"))

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Until no slot is working: an earlier test's generation (a cancelled
        stream, a timed-out call) must not share a batch with a read whose
        numerics a test compares exactly."""
        deadline = time.monotonic() + timeout_s
        while self.busy_slots():
            assert time.monotonic() < deadline, "llama-server stayed busy"
            time.sleep(0.05)


def wait_for_self_check(url: str, timeout_s: float = 300) -> None:
    """Until the proxy's repeatability self-check, which a first decision starts and which
    leases every slot while it reads, has finished (a decision sent meanwhile waits for it:
    seconds on a slow CPU)."""
    deadline = time.monotonic() + timeout_s
    while not all(
        check.get("repeatable") is not None
        for check in (
            httpx.get(url + "/v1/models", timeout=60).json().get("x_repeatable") or {"": {}}
        ).values()
    ):
        assert time.monotonic() < deadline, "the self-check did not finish"
        time.sleep(0.2)


def binaries() -> tuple[Path, Path]:
    binary = Path(os.environ.get("LLAMA_SERVER") or ensure_llama_server())
    model = Path(os.environ.get("MODEL") or ensure_model())
    return binary, model


def slow_model(blocks: int, *, zero: bool = True) -> Path:
    """The default model with its blocks run ``blocks`` times and its answers unchanged
    (``zero=False``: garbage answers), from scripts/slow_model.py's cache; made there when
    absent (`make test` makes K = 2 and SLOW_BLOCKS first). Starts nothing."""
    return ensure_slow_model(blocks, zero=zero)


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


def rss_kb(pid: int) -> int:
    """A process's resident memory, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


def launch_llama(logs_dir: Path, name: str, port: int | None = None, model: Path | None = None):
    """llama-server as the suite runs it, on ``model`` (default: ``MODEL``, else the default
    model), ready to answer."""
    binary, default = binaries()
    model = model or default
    port = port or free_port()
    log = open(logs_dir / f"{name}-{port}.log", "ab")
    proc = start_llama_server(binary, model, port, log=log)
    try:
        wait_ready(
            f"http://127.0.0.1:{port}/health",
            proc,
            why=llama_exit_reason(lambda: file_tail(log.name)),
        )
    except BaseException:
        stop(proc)
        log.close()
        raise
    _STARTED.add(f"http://127.0.0.1:{port}")
    return proc, LlamaServer(f"http://127.0.0.1:{port}", port, binary, model), log


_STARTED: set[str] = set()  # the llama-servers started here, with -ub UBATCH


def launch_proxy(logs_dir: Path, upstream_url: str, *extra: str, env: dict[str, str] | None = None):
    """The proxy before ``upstream_url``, told its -ub when the tests started it; before a
    llama-server the tests started, returned once it is ready (its self-check settled)."""
    port = free_port()
    log = open(logs_dir / f"proxy-{port}.log", "ab")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PROXY_", "UPSTREAM_"))}
    told = "--upstream-ubatch" in extra or "PROXY_UPSTREAM_UBATCH" in (env or {})
    ubatch = UBATCH if upstream_url in _STARTED and not told else None
    ours = upstream_url in _STARTED  # started with LLAMA_FLAGS: room for CONNECTIONS
    proc = start_proxy(
        port,
        upstream_url,
        list(extra),
        log=log,
        env={**clean, "PROXY_CHECK_VERDICTS": str(VERDICTS), **(env or {})},
        ubatch=ubatch,
        connections=CONNECTIONS if ours else None,
    )
    why = lambda rc: f"the proxy exited with {rc}: {file_tail(log.name)[-2000:]}"  # noqa: E731
    try:
        wait_ready(f"http://127.0.0.1:{port}/metrics", proc, timeout_s=30, why=why)
        if ours:  # as an orchestrator would: ready once its self-check has settled
            wait_ready(f"http://127.0.0.1:{port}/health", proc, timeout_s=READY_S, why=why)
    except BaseException:
        stop(proc)
        log.close()
        raise
    return proc, f"http://127.0.0.1:{port}", log


@pytest.fixture(scope="session")
def llama(logs_dir: Path) -> Iterator[LlamaServer]:
    proc, server, log = launch_llama(logs_dir, "llama")
    yield server
    stop(proc)
    log.close()


@pytest.fixture
def own_llama(logs_dir: Path):
    """A llama-server of this test's own, so stopping it disturbs nobody else: the ones
    started (a test that restarts it appends) and its port."""
    port = free_port()
    started = [launch_llama(logs_dir, "own-llama", port)]
    yield started, port
    for proc, _, log in started:
        stop(proc)
        log.close()


@pytest.fixture(scope="module")
def proxy_url(llama: LlamaServer, logs_dir: Path) -> Iterator[str]:
    proc, url, log = launch_proxy(logs_dir, llama.url)
    yield url
    stop(proc)
    log.close()
