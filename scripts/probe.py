"""Does this llama-server run here? Start it on the model, decode one token, time the prompt.

``--version`` succeeding proves nothing: the prebuilt wheel prints its version on
a CPU without AVX-512 and dies with SIGILL once it loads the model. Only loading
a model and decoding a token shows that a build runs on the CPU at hand.

Standard library only (it runs before any virtual environment exists).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_FIX",
    "Probe",
    "explain_exit",
    "free_port",
    "log_tail",
    "offloaded_layers",
    "probe",
]

# About 300 tokens of plain text: long enough for a steady prompt rate, short
# enough that three cold reads take about a second on a 2-core CPU.
_PROMPT = " ".join(
    f"Ticket {i}: the parcel ordered on day {i} arrived late and the invoice was wrong."
    for i in range(18)
)
_READS = 3


@dataclass(frozen=True)
class Probe:
    ok: bool
    reason: str = ""  # why not, in words (empty when ok)
    prompt_tokens_per_s: float = 0.0
    build_info: str = ""  # /props build_info ("b11434-...", "b0-unknown")
    gpu_layers: int = 0  # layers llama-server reported offloaded to a GPU


def free_port() -> int:
    """A TCP port free on the loopback address now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(text: str, lines: int = 6) -> str:
    """The last non-empty lines of a log, for a message."""
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


DEFAULT_FIX = (
    "run `python scripts/prepare.py llama-server --reprobe` to choose a build that "
    "runs on this CPU, or set LLAMA_SERVER to one that does"
)


def explain_exit(
    returncode: int, log: str, *, needs: str = "", has: str = "", fix: str | None = DEFAULT_FIX
) -> str:
    """What a llama-server exit means, in words: the signal, what the build needs
    against what the CPU has, the log's last lines, and what to do (``fix``; None
    or empty: nothing)."""
    fix = f"; {fix}" if fix else ""
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if sig == signal.SIGILL:
        needs_part = (
            f"this build needs {needs}"
            if needs
            else ("this build uses an instruction this CPU does not have")
        )
        has_part = f", this CPU has {has}" if has else ""
        return f"llama-server died with SIGILL (illegal instruction): {needs_part}{has_part}{fix}"
    tail = log_tail(log, 3)
    where = f"; its log ends:\n{tail}" if tail else ""
    if sig == signal.SIGKILL:
        return f"llama-server was killed (SIGKILL: out of memory, or stopped by hand){where}"
    if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        return f"llama-server was stopped ({signal.Signals(sig).name}){where}"
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"llama-server died with {name}{fix}{where}"
    return f"llama-server exited with status {returncode}{where}"


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def probe(
    binary: Path,
    model: Path,
    *,
    args: tuple[str, ...] = (),
    needs: str = "",
    has: str = "",
    gpu: bool = False,
    timeout_s: float = 180.0,
) -> Probe:
    """Start ``binary`` on ``model``, wait until healthy, read the prompt three times
    uncached with one generated token each, and stop it. ``gpu``: the model must
    also have been offloaded (llama-server's "offloaded N/M layers to GPU")."""
    port = free_port()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [str(Path(binary).parent), env.get("LD_LIBRARY_PATH")])
    )
    cmd = [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        "1",
        "-c",
        "2048",
        *args,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "llama-server.log"
        try:
            with open(log_path, "ab") as log:  # the child appends; we read by path
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except OSError as err:
            return Probe(False, f"cannot start {binary}: {err}")

        def text() -> str:
            return log_path.read_text(errors="replace")

        try:
            return _exercise(proc, f"http://127.0.0.1:{port}", text, needs, has, gpu, timeout_s)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _exercise(
    proc: subprocess.Popen, url: str, text, needs: str, has: str, gpu: bool, timeout_s: float
) -> Probe:
    def died() -> Probe:
        return Probe(False, explain_exit(proc.returncode, text(), needs=needs, has=has, fix=None))

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            return died()
        try:
            if _get(url + "/health")[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            return Probe(False, f"llama-server was not healthy after {timeout_s:.0f}s")
        time.sleep(0.1)
    offloaded = offloaded_layers(text())
    if gpu and not offloaded:
        return Probe(
            False,
            "this build found no GPU to offload the model to (no layers "
            "offloaded; is the driver installed and the device visible?)",
        )
    rates = []
    for _ in range(_READS):
        try:
            answer = _post(
                url + "/completion",
                {
                    "prompt": _PROMPT,
                    "n_predict": 1,
                    "temperature": 0,
                    "cache_prompt": False,
                },
                timeout=max(10.0, deadline - time.monotonic()),
            )
        except (OSError, ValueError) as err:
            try:
                proc.wait(2)  # a read cut short by a crash: let the exit show
            except subprocess.TimeoutExpired:
                pass
            if proc.poll() is not None:
                return died()
            return Probe(False, f"llama-server did not answer a one-token read: {err}")
        timings = answer.get("timings") or {}
        if not answer.get("tokens_predicted") and not answer.get("content"):
            return Probe(False, "llama-server answered without decoding a token")
        rates.append(float(timings.get("prompt_per_second") or 0.0))
    try:
        build = json.loads(_get(url + "/props")[1] or b"{}").get("build_info", "")
    except (OSError, ValueError):
        build = ""
    return Probe(True, prompt_tokens_per_s=max(rates), build_info=build, gpu_layers=offloaded)


def offloaded_layers(log: str) -> int:
    """The layers llama-server's log says it offloaded to a GPU (0 when none)."""
    found = re.findall(r"offloaded (\d+)/\d+ layers to GPU", log)
    return int(found[-1]) if found else 0
