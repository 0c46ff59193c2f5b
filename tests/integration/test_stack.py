"""`make run`'s launcher: both servers come up on the given ports, Ctrl-C stops both."""

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
    env = {**os.environ, "PROXY_PORT": str(proxy_port), "LLAMA_PORT": str(llama_port),
           "LLAMA_SERVER": str(binary), "MODEL": str(model)}
    log = open(tmp_path / "run.log", "wb")
    run = subprocess.Popen([sys.executable, "scripts/stack.py"], cwd=ROOT, env=env,
                           stdout=log, stderr=subprocess.STDOUT)
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
        answer = httpx.post(f"http://127.0.0.1:{proxy_port}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "semif": {"options": ["a", "b"]}})
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
