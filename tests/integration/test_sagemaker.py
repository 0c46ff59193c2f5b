"""Play SageMaker: start both containers' processes the way their entrypoints do
(`serve`, SAGEMAKER_BIND_TO_PORT), wait for /ping, then invoke."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from scripts.stack import stop
from tests.conftest import binaries, free_port
from tests.standin import StandIn

ROOT = Path(__file__).resolve().parents[2]
CHAT = {
    "messages": [{"role": "user", "content": "Ticket: refund please"}],
    "semif": {"options": ["billing", "shipping"]},
}
SYSTEM_ONE = {
    "state": "Refund please, I was charged twice.",
    "questions": {
        "team": {"type": "choice", "criteria": {"billing": None, "shipping": None}},
        "refund": {"type": "noul"},
    },
}


def _proxy_env(upstream_url: str, port: int) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "PROXY_PYTHON": sys.executable,
        "SAGEMAKER_BIND_TO_PORT": str(port),
        "UPSTREAM_URL": upstream_url,
        "PROXY_HOST": "127.0.0.1",
    }


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, logs_dir):
    binary, model = binaries()
    model_dir = tmp_path_factory.mktemp("opt-ml-model")
    (model_dir / model.name).symlink_to(model)
    llama_port, proxy_port = free_port(), free_port()
    llama_env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "LLAMA_SERVER_BIN": str(binary),
        "LD_LIBRARY_PATH": str(binary.parent),
        "LLAMA_MODEL_DIR": str(model_dir),
        "LLAMA_ARG_HOST": "127.0.0.1",
        "LLAMA_ARG_PORT": str(llama_port),
        "LLAMA_ARG_N_PARALLEL": "4",
        "LLAMA_ARG_CTX_SIZE": "32768",
        "LLAMA_ARG_UBATCH": "63",
        "LLAMA_ARG_CACHE_RAM": "0",
    }  # as python -m deploy sets it on every type
    # told llama-server's -ub, as python -m deploy tells it on CPU instance types
    proxy_env = {
        **_proxy_env(f"http://127.0.0.1:{llama_port}", proxy_port),
        "PROXY_UPSTREAM_UBATCH": "63",
    }
    with contextlib.ExitStack() as started:  # whatever started is stopped, also on a failed start
        logs = [
            started.enter_context(open(logs_dir / f"sm-{name}.log", "ab"))
            for name in ("llama", "proxy")
        ]
        proxy = subprocess.Popen(
            ["sh", str(ROOT / "docker/proxy-entrypoint.sh"), "serve"],
            cwd=ROOT,
            env=proxy_env,
            stdout=logs[1],
            stderr=subprocess.STDOUT,
        )
        started.callback(stop, proxy)
        url = f"http://127.0.0.1:{proxy_port}"
        _wait_for(url + "/metrics", proxy)
        assert httpx.get(url + "/ping").status_code == 503  # proxy up, llama-server not yet
        llama = subprocess.Popen(
            ["sh", str(ROOT / "docker/llama-entrypoint.sh"), "serve"],
            env=llama_env,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        )
        started.callback(stop, llama)
        _wait_for(url + "/ping", llama, timeout_s=120)
        yield url, proxy


def _wait_for(url, proc, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


def test_ping_answers_fast(endpoint):
    url, _ = endpoint
    started = time.monotonic()
    assert httpx.get(url + "/ping", timeout=10).status_code == 200
    assert time.monotonic() - started < 2  # SageMaker's ping timeout


def test_invocations_takes_chat_and_system_one_bodies(endpoint):
    url, _ = endpoint
    chat = httpx.post(url + "/invocations", json=CHAT, timeout=60)
    assert chat.status_code == 200 and chat.json()["semif"]["choice"] in ("billing", "shipping")
    plain = httpx.post(
        url + "/invocations", timeout=60, json={"messages": CHAT["messages"], "max_tokens": 3}
    )
    assert plain.status_code == 200 and plain.json()["object"] == "chat.completion"
    s1 = httpx.post(url + "/invocations", json=SYSTEM_ONE, timeout=60)
    assert s1.status_code == 200 and set(s1.json()["answers"]) == {"team", "refund"}


@pytest.mark.parametrize(
    ("body", "status", "shape"),
    [
        ({"hello": "world"}, 400, "error"),
        ({"state": None, "questions": {"q": {"type": "noul"}}}, 422, "detail"),
        ({"messages": [], "semif": {"options": ["a"]}}, 400, "error"),
    ],
)
def test_invocations_refuses_bad_bodies_in_the_matching_shape(endpoint, body, status, shape):
    url, _ = endpoint
    resp = httpx.post(url + "/invocations", json=body, timeout=30)
    assert resp.status_code == status and shape in resp.json()


def test_sigterm_drains_in_flight_requests_then_exits(logs_dir):
    """A decision in flight when SIGTERM arrives is answered, then the proxy exits.
    The upstream is a stand-in that takes 3 s, whatever the CPU's speed."""
    port = free_port()
    with StandIn() as standin, open(logs_dir / "sm-drain.log", "ab") as log:
        standin.mode, standin.delay_s = "slow", 3.0
        proxy = subprocess.Popen(
            ["sh", str(ROOT / "docker/proxy-entrypoint.sh"), "serve"],
            cwd=ROOT,
            env=_proxy_env(standin.url, port),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_for(url + "/ping", proxy)
            result = {}

            def call():
                result["resp"] = httpx.post(url + "/invocations", timeout=60, json=CHAT)
                result["answered"] = time.monotonic()

            worker = threading.Thread(target=call)
            worker.start()
            deadline = time.monotonic() + 10
            while standin.hits_chat == 0:  # the read is at the upstream: the request is in flight
                assert time.monotonic() < deadline, "the decision never reached the upstream"
                time.sleep(0.02)
            signalled = time.monotonic()
            proxy.send_signal(signal.SIGTERM)
            worker.join(30)
            assert result["resp"].status_code == 200
            assert result["resp"].json()["semif"]["choice"] in CHAT["semif"]["options"]
            assert result["answered"] - signalled > 1.0  # it waited for the slow read
            assert proxy.wait(15) == 0
            # drained: answered first, then gone promptly
            assert time.monotonic() - result["answered"] < 10
        finally:
            stop(proxy)
