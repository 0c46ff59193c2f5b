"""The single image's two processes, run as Dockerfile.single runs them: its entrypoint
starts the real supervisord with docker/supervisord.conf, which starts the real
llama-server (through docker/llama-entrypoint.sh) and the real proxy. Only the paths
differ from the image (no Docker engine here)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import binaries, free_port

ROOT = Path(__file__).resolve().parents[2]
S1 = {"state": "My parcel never arrived.", "questions": {"late": {"type": "noul"}}}


def children(pid: int) -> dict[str, int]:
    """supervisord's programs by name: {"llama": pid, "proxy": pid}."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    named = {}
    for child in map(int, out.split()):
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        named["llama" if b"llama-server" in cmdline else "proxy"] = child
    return named


def environ(pid: int) -> dict[str, str]:
    """The environment a process was started with."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(e.split("=", 1) for e in entries if "=" in e)


def status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.TransportError:
        return None


def until(check, timeout_s: float, what: str, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s} s; log:\n{log.read_text()[-3000:]}")


@pytest.fixture
def single(tmp_path):
    binary, model = binaries()
    proxy_port, llama_port = free_port(), free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PROXY_", "UPSTREAM_", "LLAMA_ARG_", "SAGEMAKER_"))
    }
    env.update(
        {
            # what SageMaker sets: the port to serve on, and the range for extra ports
            "SAGEMAKER_BIND_TO_PORT": str(proxy_port),
            "SAGEMAKER_SAFE_PORT_RANGE": f"{llama_port}-{llama_port}",
            # the image's paths, here
            "SUPERVISORD": str(Path(sys.executable).with_name("supervisord")),
            "SEMIF_SUPERVISOR_CONF": str(ROOT / "docker" / "supervisord.conf"),
            "SEMIF_LLAMA_ENTRYPOINT": str(ROOT / "docker" / "llama-entrypoint.sh"),
            "SEMIF_PROXY_ENTRYPOINT": str(ROOT / "docker" / "proxy-entrypoint.sh"),
            "SEMIF_RUN_DIR": str(tmp_path),
            "LLAMA_SERVER_BIN": str(binary),
            "LLAMA_MODEL_DIR": str(model.parent),
            "PROXY_PYTHON": sys.executable,
            "PROXY_HOST": "127.0.0.1",
        }
    )
    log = tmp_path / "container.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(ROOT / "docker" / "single-entrypoint.sh"), "serve"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{proxy_port}"
    try:
        until(lambda: status(url + "/ping") == 200, 120, "/ping answered 200", log)
        yield proc, url, f"http://127.0.0.1:{llama_port}", log
    finally:  # as the container stops: SIGTERM stops both; anything left is killed
        left = children(proc.pid).values() if proc.poll() is None else ()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_both_processes_serve_sagemakers_contract_on_its_ports(single):
    proc, url, llama_url, _ = single
    # llama-server on the range's port, loopback only; the proxy on SAGEMAKER_BIND_TO_PORT
    assert httpx.get(llama_url + "/health").status_code == 200
    answer = httpx.post(url + "/invocations", json=S1, timeout=120)
    assert answer.status_code == 200 and 0 <= answer.json()["answers"]["late"]["noul"] <= 1
    lines = httpx.post(
        url + "/invocations",
        content=b'{"state": "x", "questions": {}}\n{bad\n',
        headers={"Content-Type": "application/jsonlines"},
        timeout=120,
    )
    assert lines.status_code == 200 and len(lines.text.splitlines()) == 2
    assert set(children(proc.pid)) == {"llama", "proxy"}


def test_llama_server_runs_with_ub_63_and_no_prompt_cache_and_the_proxy_is_told_so(single):
    proc, url, _, log = single
    pids = children(proc.pid)
    # the image's default: the proxy reads new conversations in one request, bit for bit
    # repeatable (docs/repeatability.md), as make run does
    assert environ(pids["llama"])["LLAMA_ARG_UBATCH"] == "63"
    assert environ(pids["proxy"])["PROXY_UPSTREAM_UBATCH"] == "63"
    # no host-memory prompt cache, which would move saved states between slots under the
    # proxy's reads (--cache-ram 0, as make run starts it)
    assert environ(pids["llama"])["LLAMA_ARG_CACHE_RAM"] == "0"
    # and llama-server read it: without the cache it turns its idle-slot saving off at start-up
    assert "--cache-idle-slots requires --cache-ram, disabling" in log.read_text()
    first = httpx.post(url + "/invocations", json=S1, timeout=120)
    again = httpx.post(url + "/invocations", json=S1, timeout=120)
    assert first.status_code == again.status_code == 200
    # the same probabilities (what was read from the cache may differ)
    (a, b) = (r.json()["answers"]["late"] for r in (first, again))
    assert (a["noul"], a["x_label_mass"]) == (b["noul"], b["x_label_mass"])


def test_a_llama_server_crash_restarts_it_and_never_the_proxy(single):
    proc, url, _, log = single
    before = children(proc.pid)
    os.kill(before["llama"], signal.SIGKILL)
    seen = set()

    def back() -> bool:
        assert status(url + "/livez") == 200  # the proxy process is alive throughout
        seen.add(status(url + "/ping"))
        return 200 in seen and children(proc.pid).get("llama") not in (None, before["llama"])

    until(back, 60, "llama-server restarted", log)
    after = children(proc.pid)
    assert after["proxy"] == before["proxy"]
    assert httpx.post(url + "/invocations", json=S1, timeout=120).status_code == 200


def test_sigterm_stops_both_within_sagemakers_30_s(single):
    proc, _, _, _ = single
    pids = children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
