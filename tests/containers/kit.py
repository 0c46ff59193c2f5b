"""What the container suite's tests share: waiting, HTTP probes, containers started and
removed, and the figures printed at the end (image sizes, times to healthy)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx

from scripts.containers import Engine

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# what the suite measured, printed after the run (pytest_terminal_summary): not test bounds
FIGURES: list[tuple[str, str]] = []

READY_S = 600  # a container's start to healthy: llama-server's load and the self-check
S1 = {"state": "My parcel never arrived.", "questions": {"late": {"type": "noul"}}}
CHAT = {
    "messages": [{"role": "user", "content": "Where is my parcel? It was due on Monday."}],
    "semif": {"options": ["billing", "shipping"]},
}


def figure(what: str, value: str) -> None:
    FIGURES.append((what, value))


def until(
    check: Callable[[], T | None], timeout_s: float, what: str, log: Callable[[], str] = lambda: ""
) -> T:
    """``check()``'s first true value, polled twice a second, or an AssertionError naming
    ``what`` with ``log()``'s tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout_s} s; log:\n{log()[-4000:]}")


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.TransportError:
        return None


def image_size_mb(engine: Engine, image: str) -> float:
    size = engine.docker("image", "inspect", "--format", "{{.Size}}", image).stdout
    return int(size) / 1e6


def health(engine: Engine, container: str) -> str:
    got = engine.docker(
        "inspect",
        "--format",
        "{{if .State.Health}}{{.State.Health.Status}}{{end}}",
        container,
        check=False,
    )
    return got.stdout.strip()


@contextmanager
def container(
    engine: Engine, image: str, name: str, *args: str, command: tuple[str, ...] = ()
) -> Iterator[str]:
    """``docker run --detach`` of ``image`` as ``name`` (docker run's own options in
    ``args``), removed afterwards whatever happened."""
    engine.docker("rm", "--force", name, check=False)
    engine.docker("run", "--detach", "--name", name, *args, image, *command)
    try:
        yield name
    finally:
        engine.docker("rm", "--force", "--volumes", name, check=False)


def logs(engine: Engine, name: str) -> Callable[[], str]:
    def read() -> str:
        got = engine.docker("logs", "--tail", "200", name, check=False)
        return got.stdout + got.stderr

    return read


def in_image(engine: Engine, image: str, script: str, user: str | None = None) -> str:
    """What ``sh -c script`` prints inside ``image`` (its entrypoint set aside)."""
    extra = ["--user", user] if user else []
    got = engine.docker(
        "run", "--rm", *extra, "--entrypoint", "sh", image, "-c", script, check=False
    )
    return got.stdout + got.stderr
