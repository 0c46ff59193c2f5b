"""The real-speed lane: the default model with its blocks run SLOW_BLOCKS times (8: about a
1B model's compute, the default model's answers; scripts/slow_model.py), so a read takes
seconds as it does for this project's users. Each test asserts generous bounds, so that it
cannot flake; the targets live in the benchmarks (docs/performance.md, "At a real model's
speed"). The figures measured are printed at the end of the run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.stack import stop
from tests.conftest import LlamaServer, free_port, launch_llama, slow_model

BLOCKS = int(os.environ.get("SLOW_BLOCKS") or 8)
FIGURES: dict[str, str] = {}  # what the lane measured, printed in the summary


def pytest_terminal_summary(terminalreporter) -> None:
    if FIGURES:
        terminalreporter.section(f"real-speed lane: the default model's blocks x{BLOCKS}")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")


class Slow:
    """A llama-server on the slow model, on a port of its own, that a test may restart."""

    def __init__(self, logs_dir: Path, model: Path, name: str):
        self.logs_dir, self.model, self.name = logs_dir, model, name
        self.port = free_port()
        self.proc, self.server, self.log = launch_llama(logs_dir, name, self.port, model=model)

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        stop(self.proc)
        self.log.close()

    def restart(self) -> None:
        self.stop()
        self.proc, self.server, self.log = launch_llama(
            self.logs_dir, self.name, self.port, model=self.model
        )


@pytest.fixture(scope="session")
def slow(logs_dir: Path) -> Iterator[Slow]:
    server = Slow(logs_dir, slow_model(BLOCKS), "slow-llama")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def slow_llama(slow: Slow) -> LlamaServer:
    return slow.server
