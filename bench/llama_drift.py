"""llama-server alone, from its start: the same shape of read back to back for minutes, to
see whether a fresh server (or the machine) reads slower at first and how far its speed
wanders, with no proxy in the way.

    .venv/bin/python bench/llama_drift.py [--blocks 8] [--minutes 4] [--restarts 1]
    MODEL=path.gguf .venv/bin/python bench/llama_drift.py

One llama-server as `make run` starts it; each read is a new 33-token text after a fixed
24-token opening, in slot 0 (``/completion``, one token with 16 log-probabilities, as a
decision reads). Prints llama-server's own milliseconds per prompt token, median per 30 s
since the server's start, for the first start and each restart (``--restarts``, each
``--minutes`` / 2 long). bench/real_speed.py compares single decisions after a start
against a warm median: this shows the spread such a comparison stands in.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._machine import command_line, describe  # noqa: E402
from scripts.prepare import ensure_llama_server  # noqa: E402
from scripts.probe import free_port  # noqa: E402
from scripts.slow_model import ensure_slow_model  # noqa: E402
from scripts.stack import start_llama_server, stop, wait_ready  # noqa: E402

OPENING = "<|im_start|>system\nYou sort support tickets.<|im_end|>\n<|im_start|>user\n"
TEXT = "Ticket {n}: since the last update the app closes when I open my order history."
WINDOW_S = 30


def run(binary: Path, model: Path, minutes: float, log) -> list[tuple[float, float]]:
    """(seconds since the server was started, ms per prompt token) of each read."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    proc = start_llama_server(binary, model, port, log=log)
    try:
        wait_ready(url + "/health", proc, timeout_s=600)
        with httpx.Client(base_url=url, timeout=600) as client:
            opening = client.post("/tokenize", json={"content": OPENING}).json()["tokens"][:24]
            reads, n = [], 0
            while time.monotonic() - started < minutes * 60:
                text = client.post("/tokenize", json={"content": TEXT.format(n=n)}).json()
                body = {
                    "prompt": opening + text["tokens"][:33],
                    "n_predict": 1,
                    "n_probs": 16,
                    "id_slot": 0,
                    "cache_prompt": True,
                }
                timings = client.post("/completion", json=body).json()["timings"]
                reads.append(
                    (time.monotonic() - started, timings["prompt_ms"] / timings["prompt_n"])
                )
                n += 1
        return reads
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8, help="the slow model's K")
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--restarts", type=int, default=1)
    args = parser.parse_args()
    model = Path(os.environ.get("MODEL") or ensure_slow_model(args.blocks))
    binary = Path(os.environ.get("LLAMA_SERVER") or ensure_llama_server())
    os.environ["MODEL"] = str(model)
    print(command_line())
    print(describe())
    with tempfile.TemporaryFile() as log:
        for attempt in range(1 + args.restarts):
            minutes = args.minutes if attempt == 0 else args.minutes / 2
            reads = run(binary, model, minutes, log)
            name = "first start" if attempt == 0 else f"restart {attempt}"
            print(f"\n{name}: ms per prompt token, median per {WINDOW_S} s since its start")
            windows: dict[int, list[float]] = {}
            for at, ms in reads:
                windows.setdefault(int(at // WINDOW_S), []).append(ms)
            for k, values in sorted(windows.items()):
                print(
                    f"  {k * WINDOW_S:4d}-{(k + 1) * WINDOW_S:<4d} s  "
                    f"{statistics.median(values):6.1f}  (n = {len(values)})"
                )
            all_ms = [ms for _, ms in reads]
            print(
                f"  all: median {statistics.median(all_ms):.1f}, "
                f"range {min(all_ms):.1f}-{max(all_ms):.1f} (n = {len(all_ms)})"
            )


if __name__ == "__main__":
    main()
