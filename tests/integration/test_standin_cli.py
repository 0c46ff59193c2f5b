"""``python -m tests.standin``, the stand-in bench/cpu.py runs in its own process: the
port, ``--tokens``, ``--slots`` and ``--token-ms`` it is started with are the ones it
serves, and a port it cannot have ends it at once with the reason."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx

from scripts.stack import stop, wait_ready
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_standin_serves_the_slots_and_reads_it_is_started_with():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.standin", str(port), "--tokens", "--slots", "8"], cwd=ROOT
    )
    try:
        wait_ready(url + "/health", proc, timeout_s=30)
        assert httpx.get(url + "/props").json() == {"total_slots": 8}
        # --tokens: any text one token per character
        assert httpx.post(url + "/tokenize", json={"content": "ab"}).json() == {"tokens": [97, 98]}
        # --tokens: /completion answers with a simulated slot cache, the second time cached
        body = {"prompt": [5, 6, 7], "id_slot": 3, "n_probs": 4}
        first = httpx.post(url + "/completion", json=body).json()
        again = httpx.post(url + "/completion", json=body).json()
        assert first["timings"] == {"cache_n": 0, "prompt_n": 3}
        assert again["timings"] == {"cache_n": 2, "prompt_n": 1}
        assert len(again["completion_probabilities"][0]["top_logprobs"]) == 26
    finally:
        stop(proc)
    assert proc.returncode == 0  # SIGTERM: a clean exit


def test_standin_reports_timings_as_if_each_token_took_token_ms():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.standin", str(port), "--tokens", "--token-ms", "0.5"],
        cwd=ROOT,
    )
    try:
        wait_ready(url + "/health", proc, timeout_s=30)
        body = {"prompt": [5, 6, 7, 8], "id_slot": 0, "n_probs": 4}
        first = httpx.post(url + "/completion", json=body).json()
        again = httpx.post(url + "/completion", json=body).json()
        assert first["timings"] == {"cache_n": 0, "prompt_n": 4, "prompt_ms": 2.0}
        assert again["timings"] == {"cache_n": 3, "prompt_n": 1, "prompt_ms": 0.5}
    finally:
        stop(proc)


def test_standin_defaults_to_two_slots():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.standin", str(port)], cwd=ROOT)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", proc, timeout_s=30)
        assert httpx.get(f"http://127.0.0.1:{port}/props").json() == {"total_slots": 2}
        tokens = httpx.post(f"http://127.0.0.1:{port}/tokenize", json={"content": "ab"}).json()
        assert tokens == {"tokens": [0, 0, 0]}  # without --tokens: the proxy reads through chat
    finally:
        stop(proc)


def test_standin_on_a_port_in_use_exits_with_the_reason():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tests.standin", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode != 0
    assert f"the stand-in did not start on http://127.0.0.1:{port}" in done.stderr
