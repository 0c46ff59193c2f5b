"""``python -m proxy --workers 2`` over the real llama-server: both workers serve the port,
a scrape on either shows the whole proxy's counts, a worker that dies is started again
while the other serves, and SIGTERM stops them all."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from scripts.stack import stop
from tests.conftest import launch_proxy

DECISION = {
    "messages": [{"role": "user", "content": "I was charged twice for my order."}],
    "semif": {"options": ["billing", "shipping", "technical"]},
}


@pytest.fixture()
def two_workers(llama, logs_dir):
    proc, url, log = launch_proxy(logs_dir, llama.url, "--workers", "2")
    try:
        _wait_for(lambda: len(_workers(proc.pid)) == 2 and _processes(url) == 2, "two workers")
        yield proc, url
    finally:
        stop(proc)
        log.close()


def _workers(pid: int) -> list[int]:
    """The worker processes (not multiprocessing's resource tracker)."""
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
        except FileNotFoundError:  # it just ended
            pass
    return found


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _scrape(url: str) -> str:
    return httpx.get(url + "/metrics", headers={"Connection": "close"}).text


def _processes(url: str) -> int:
    """How many workers a scrape counted (0 when one did not answer: 503)."""
    found = re.search(r"^semif_worker_processes (\S+)$", _scrape(url), re.M)
    return int(float(found.group(1))) if found else 0


def _decisions(text: str) -> int:
    found = re.search(
        r'^semif_request_duration_seconds_count\{kind="decision",outcome="ok",'
        r'route="/v1/chat/completions"\} (\S+)$',
        text,
        re.M,
    )
    return int(float(found.group(1))) if found else 0


def _wait_for(check, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout_s:g} s")
        time.sleep(0.2)


def _decide(url: str) -> None:
    resp = httpx.post(
        url + "/v1/chat/completions", json=DECISION, timeout=60, headers={"Connection": "close"}
    )  # a new connection each: spread
    assert resp.status_code == 200, resp.text


def test_both_workers_serve_and_every_scrape_counts_all_of_them(two_workers):
    proc, url = two_workers
    workers = _workers(proc.pid)
    before = {pid: _cpu_ticks(pid) for pid in workers}
    for _ in range(60):
        _decide(url)
    used = {pid: _cpu_ticks(pid) - before[pid] for pid in workers}
    assert all(ticks > 0 for ticks in used.values()), used  # the kernel gave both connections
    scrapes = [_scrape(url) for _ in range(8)]  # new connections: both workers answer some
    assert [_decisions(text) for text in scrapes] == [60] * 8
    assert all("\nsemif_worker_processes 2.0\n" in text for text in scrapes)


def test_a_worker_that_dies_is_started_again_while_the_other_serves(two_workers):
    proc, url = two_workers
    victim = _workers(proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    for _ in range(5):
        _decide(url)  # answered by the other worker meanwhile
    _wait_for(
        lambda: (
            len(_workers(proc.pid)) == 2
            and victim not in _workers(proc.pid)
            and _processes(url) == 2
        ),
        "second worker again",
    )
    assert proc.poll() is None


def test_sigterm_stops_every_worker(two_workers):
    proc, url = two_workers
    workers = _workers(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not [
        pid
        for pid in workers
        if Path(f"/proc/{pid}").exists()
        and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    ]


def test_a_port_in_use_stops_the_workers_with_a_message(llama, logs_dir):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy",
                "--port",
                str(port),
                "--upstream-url",
                llama.url,
                "--workers",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        holder.close()
    assert run.returncode == 1
    assert "before it was ready: stopping" in run.stderr
    assert "address already in use" in run.stderr.lower()
