"""`make run`'s launcher: both servers come up on the given ports, Ctrl-C stops both."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import binaries, free_port

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_run_starts_both_and_ctrl_c_stops_both(tmp_path):
    binary, model = binaries()
    proxy_port, llama_port = free_port(), free_port()
    env = {
        **os.environ,
        "PROXY_PORT": str(proxy_port),
        "LLAMA_PORT": str(llama_port),
        "LLAMA_SERVER": str(binary),
        "MODEL": str(model),
    }
    log = open(tmp_path / "run.log", "wb")
    run = subprocess.Popen(
        [sys.executable, "scripts/stack.py"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{proxy_port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert run.poll() is None, (tmp_path / "run.log").read_text()
            time.sleep(0.3)
        answer = httpx.post(
            f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
            timeout=60,
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "semif": {"options": ["a", "b"]},
            },
        )
        assert answer.status_code == 200
        children = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True)
        pids = [int(p) for p in children.stdout.split()]
        assert len(pids) == 2  # llama-server and the proxy
        run.send_signal(signal.SIGINT)
        assert run.wait(30) == 0
        time.sleep(0.5)
        assert not any(_alive(pid) for pid in pids)
        assert "ready in" in (tmp_path / "run.log").read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        log.close()


@contextlib.contextmanager
def _running(tmp_path, **env_extra):
    """``scripts/stack.py`` on free ports, its output in ``run.log``; killed on the way
    out if the test left it running."""
    binary, model = binaries()
    proxy_port, llama_port = free_port(), free_port()
    env = {
        **os.environ,
        "PROXY_PORT": str(proxy_port),
        "LLAMA_PORT": str(llama_port),
        "LLAMA_SERVER": str(binary),
        "MODEL": str(model),
        **env_extra,
    }
    with open(tmp_path / "run.log", "wb") as log:
        run = subprocess.Popen(
            [sys.executable, "scripts/stack.py"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield run, f"http://127.0.0.1:{proxy_port}", llama_port
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def _llama_pid(run_pid: int, llama_port: int) -> int:
    for pid in _children(run_pid):
        if f"--port\0{llama_port}\0" in Path(f"/proc/{pid}/cmdline").read_text():
            return pid
    raise AssertionError("no llama-server child")


def test_a_killed_llama_server_gives_503_then_answers_again_by_itself(tmp_path):
    decision = {"messages": [{"role": "user", "content": "hi"}], "semif": {"options": ["a", "b"]}}
    with _running(tmp_path) as (run, url, llama_port):
        _wait_healthy(url, run, tmp_path)
        assert (
            httpx.post(url + "/v1/chat/completions", json=decision, timeout=60).status_code == 200
        )
        os.kill(_llama_pid(run.pid, llama_port), signal.SIGKILL)
        killed = time.monotonic()
        statuses = []
        while time.monotonic() - killed < 60:
            resp = httpx.post(url + "/v1/chat/completions", json=decision, timeout=60)
            statuses.append(resp.status_code)
            if resp.status_code == 200:
                break
            assert resp.status_code == 503 and int(resp.headers["Retry-After"]) > 0
            time.sleep(0.2)
        assert statuses[0] == 503 and statuses[-1] == 200, statuses
        text = (tmp_path / "run.log").read_text()
        assert "[run] llama-server stopped: llama-server was killed (SIGKILL" in text
        assert "[run] starting llama-server again in 1s (1 of 5 quick restarts)" in text
        run.send_signal(signal.SIGINT)
        assert run.wait(30) == 0


def test_a_llama_server_that_cannot_start_is_explained_and_nothing_is_left(tmp_path):
    dies = tmp_path / "llama-server"
    dies.write_text("#!/bin/sh\necho 'load_model: loading model'\nkill -ILL $$\n")
    dies.chmod(0o755)
    with _running(tmp_path, LLAMA_SERVER=str(dies)) as (run, _, _):
        assert run.wait(60) == 1
    text = (tmp_path / "run.log").read_text()
    assert "[run] llama-server died with SIGILL (illegal instruction)" in text
    assert "Traceback" not in text
    assert subprocess.run(["pgrep", "-f", str(dies)], capture_output=True).stdout == b""


def _wait_healthy(url, run, tmp_path, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert run.poll() is None, (tmp_path / "run.log").read_text()
        time.sleep(0.3)
    raise AssertionError("make run never became healthy")
