"""make run's restart loop, on tiny real processes (sh), without waiting for back-offs."""

from __future__ import annotations

import subprocess

import pytest

import scripts.stack as stack
from scripts.stack import ServerExited, Supervised


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch):
    monkeypatch.setattr(stack, "_BACKOFF_S", (0, 0, 0))
    monkeypatch.setattr(stack.time, "sleep", lambda s: None)


def _child(script: str, starts: list[int]) -> Supervised:
    def start(log):
        starts.append(1)
        return subprocess.Popen(["sh", "-c", script], stdout=log, stderr=subprocess.STDOUT)

    return Supervised(
        "llama-server",
        start,
        "http://127.0.0.1:1/health",
        lambda rc, log: f"exited with {rc}: {log.strip()}",
    )


def test_a_crash_is_reported_and_the_process_started_again():
    starts: list[int] = []
    said: list[str] = []
    child = _child("echo boom; exit 3", starts)
    child.start()
    child.proc.wait()
    assert child.exited()
    child.restart_after_exit(said.append)
    assert len(starts) == 2
    assert said == [
        "llama-server stopped: exited with 3: boom",
        "starting llama-server again in 0s (1 of 3 quick restarts)",
    ]
    child.stop()


def test_repeated_quick_crashes_give_up_with_a_message():
    starts: list[int] = []
    child = _child("exit 1", starts)
    child.start()
    with pytest.raises(ServerExited, match="crashed 4 times in a row, each within 60s"):
        for _ in range(10):
            child.proc.wait()
            child.restart_after_exit(lambda _: None)
    assert len(starts) == 4  # the first start and three restarts, each of which crashed


def test_a_process_that_ran_a_while_starts_its_count_again(monkeypatch):
    starts: list[int] = []
    child = _child("exit 1", starts)
    child.start()
    for _ in range(2):
        child.proc.wait()
        child.restart_after_exit(lambda _: None)
    assert child.crashes == 2
    child.started_at -= 120  # it stayed up two minutes before this crash
    child.proc.wait()
    child.restart_after_exit(lambda _: None)
    assert child.crashes == 1
    child.stop()
