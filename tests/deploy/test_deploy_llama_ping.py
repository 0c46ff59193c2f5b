"""The llama image's /ping, with the real llama-server started by the real entrypoint.

SageMaker health-checks every container with GET /ping. Dockerfile.llama points
LLAMA_ARG_STATIC_PATH at a folder holding a file ``ping``; llama-server serves it once the
model is loaded (503 before). It has no /invocations, which is why the endpoint uses
Direct mode rather than a Serial pipeline.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from scripts.prepare import ensure_llama_server, ensure_model
from scripts.stack import stop

ENTRYPOINT = Path(__file__).resolve().parents[2] / "docker" / "llama-entrypoint.sh"
pytestmark = pytest.mark.integration


def status(url: str, method: str = "GET") -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ping_is_served_by_llama_server_once_ready(tmp_path: Path):
    binary = Path(os.environ.get("LLAMA_SERVER") or ensure_llama_server())
    model = Path(os.environ.get("MODEL") or ensure_model())
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "ping").write_text("ok\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / model.name).symlink_to(model)
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "LD_LIBRARY_PATH": str(binary.parent),
        "LLAMA_SERVER_BIN": str(binary),
        "LLAMA_MODEL_DIR": str(tmp_path / "model"),
        "LLAMA_ARG_STATIC_PATH": str(tmp_path / "static"),
        "LLAMA_ARG_HOST": "127.0.0.1",
        "LLAMA_ARG_CTX_SIZE": "2048",
        "SAGEMAKER_BIND_TO_PORT": str(port),
    }
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "llama.log", "wb") as log:
        proc = subprocess.Popen(
            ["sh", str(ENTRYPOINT), "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            seen: list[int] = []
            deadline = time.monotonic() + 120
            while (not seen or seen[-1] != 200) and time.monotonic() < deadline:
                assert proc.poll() is None, (tmp_path / "llama.log").read_text()[-2000:]
                try:
                    seen.append(status(f"{base}/ping"))
                except (urllib.error.URLError, OSError):
                    pass  # not listening yet
                time.sleep(0.05)
            assert seen and seen[-1] == 200
            assert set(seen) <= {200, 503}  # 503 while loading, never 404
            assert status(f"{base}/health") == 200
            assert status(f"{base}/metrics") == 200
            assert status(f"{base}/invocations", "POST") == 404
        finally:
            stop(proc)
