"""Decisions after start and after restarts, against a warm one, at a real model's speed.

    .venv/bin/python bench/real_speed.py [--blocks 8] [--warm 5]   # the slow model
    MODEL=path.gguf .venv/bin/python bench/real_speed.py            # any model

The slow model (scripts/slow_model.py) is the default model with its blocks run
``--blocks`` times: its answers, about a 1B model's compute. One llama-server as `make
run` starts it, one proxy before it with a fresh verdicts file (``PROXY_CHECK_VERDICTS``).
In one run, in this order:

- the first start: seconds from the proxy's start to ``/health`` 200 (the self-check runs
  before ready; its own time from the proxy's log), then the first and second decision;
- warm decisions: new tickets of the same shape (the same options and length, each
  opening with a word no other ticket opens with);
- llama-server stopped and started again on its port: seconds from its own ``/health`` to
  the proxy's, then the first and second decision;
- the proxy stopped and started again with the verdict kept: start to ready, then the
  first decision;
- warm decisions again (the warm figure is the median of both sets, so drift across
  the run falls on both sides).

Prints each decision's seconds and its ratio to the warm median, beside llama-server's own
time for the decision's reads (from its log) and that time's ratio to its warm median: a
first decision slower in both is llama-server's (or the machine's) doing, not the proxy's;
and the readiness delays. Targets (issue 54): every ratio at most 1.1; ready within 5 s
of llama-server's ``/health`` with a kept verdict. Each ratio is one decision against a median of
``2 x --warm``: rerun it to see the spread.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._machine import command_line, describe  # noqa: E402
from bench._servers import POLL_S  # noqa: E402
from scripts.prepare import ensure_llama_server  # noqa: E402
from scripts.probe import free_port  # noqa: E402
from scripts.slow_model import ensure_slow_model  # noqa: E402
from scripts.stack import (  # noqa: E402
    CONNECTIONS,
    UBATCH,
    start_llama_server,
    start_proxy,
    stop,
    wait_ready,
)

OPTIONS = ["billing", "shipping", "technical"]
BODY = ": since the last update the app closes when I open my order history."
# Each ticket opens with its own word, so that it shares nothing but the chat template
# with the tickets before it, as a new ticket does: numbered tickets ("Ticket 1001: ...")
# share their first tokens with the one before, and a warm decision would read those
# tokens from the cache where the first one after a start reads them anew.
WORDS = (
    "Hello Since Today Yesterday Again Please Sorry Thanks Help Urgent Hi Morning Evening "
    "Update Order Account Question Problem Issue Note Request Customer Team Support Dear "
    "Attention Regarding Reminder Follow Status Notice Subject Quick Another Second Third"
).split()


def openings(llama_url: str, needed: int) -> list[str]:
    """``needed`` words of ``WORDS`` that give tickets of one length in tokens and begin
    with a token no other ticket begins with (llama-server's /tokenize)."""
    seen: dict[int, str] = {}
    lengths: dict[str, int] = {}
    for word in WORDS:
        tokens = httpx.post(llama_url + "/tokenize", json={"content": word + BODY}).json()["tokens"]
        if tokens[0] not in seen:
            seen[tokens[0]] = word
            lengths[word] = len(tokens)
    common = statistics.mode(lengths.values())
    words = [w for w in seen.values() if lengths[w] == common]
    if len(words) < needed:
        raise SystemExit(f"only {len(words)} distinct one-length openings; {needed} needed")
    return words[:needed]


def ticket(word: str) -> dict:
    text = word + BODY
    return {"messages": [{"role": "user", "content": text}], "semif": {"options": OPTIONS}}


def decide(url: str, word: str, llama_log: Path) -> tuple[float, float]:
    """One decision's seconds as the client waited, and llama-server's own seconds for its
    reads (the ``total time`` its log prints for each task the decision sent)."""
    offset = llama_log.stat().st_size
    started = time.monotonic()
    resp = httpx.post(url + "/v1/chat/completions", json=ticket(word), timeout=900)
    resp.raise_for_status()
    waited = time.monotonic() - started
    time.sleep(0.2)  # llama-server prints its timings as the task ends
    with open(llama_log, "rb") as log:
        log.seek(offset)
        printed = log.read().decode(errors="replace")
    own = sum(float(ms) for ms in re.findall(r"total time = +([\d.]+) ms", printed)) / 1000
    return waited, own


def ready_after(url: str, since: float) -> float:
    while True:
        try:
            if httpx.get(url + "/health", timeout=30).status_code == 200:
                return time.monotonic() - since
        except httpx.TransportError:
            pass
        time.sleep(POLL_S)  # each poll is a /health call through to llama-server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8, help="the slow model's K")
    parser.add_argument("--warm", type=int, default=5, help="warm decisions, twice")
    args = parser.parse_args()
    model = Path(os.environ.get("MODEL") or ensure_slow_model(args.blocks))
    binary = Path(os.environ.get("LLAMA_SERVER") or ensure_llama_server())
    os.environ["MODEL"] = str(model)  # what describe() reports
    print(command_line())
    print(describe())
    tmp = Path(tempfile.mkdtemp(prefix="real-speed-"))
    logs = {name: open(tmp / f"{name}.log", "ab") for name in ("llama", "proxy")}
    llama_port, proxy_port = free_port(), free_port()
    llama_url, url = f"http://127.0.0.1:{llama_port}", f"http://127.0.0.1:{proxy_port}"
    env = {**os.environ, "PROXY_CHECK_VERDICTS": str(tmp / "verdicts.json")}
    rows: list[tuple[str, tuple[float, float]]] = []
    ready: list[tuple[str, float]] = []

    def start_llama():
        proc = start_llama_server(binary, model, llama_port, log=logs["llama"])
        wait_ready(llama_url + "/health", proc, timeout_s=600)
        return proc

    def start_our_proxy():
        return start_proxy(
            proxy_port,
            llama_url,
            log=logs["proxy"],
            env=env,
            ubatch=UBATCH,
            connections=CONNECTIONS,
        )

    llama = start_llama()
    tickets = iter(openings(llama_url, 5 + 2 * args.warm))
    started = time.monotonic()
    proxy = start_our_proxy()
    try:
        ready.append(("first start: proxy start to ready", ready_after(url, started)))
        log = (tmp / "proxy.log").read_text()
        check = re.search(r"self-check on \S+: .+? in ([\d.]+)s", log)
        ready.append(("  of which the self-check", float(check[1]) if check else float("nan")))
        rows += [("first decision after start", decide(url, next(tickets), tmp / "llama.log"))]
        rows += [("second decision after start", decide(url, next(tickets), tmp / "llama.log"))]
        warm = [decide(url, next(tickets), tmp / "llama.log") for _ in range(args.warm)]

        stop(llama)
        llama = start_llama()
        back = ready_after(url, time.monotonic())
        ready.append(("llama-server restart: its /health to the proxy's", back))
        rows += [
            (
                "first decision after a llama-server restart",
                decide(url, next(tickets), tmp / "llama.log"),
            )
        ]
        rows += [("second decision after it", decide(url, next(tickets), tmp / "llama.log"))]

        stop(proxy)
        started = time.monotonic()
        proxy = start_our_proxy()
        ready.append(("proxy restart, verdict kept: start to ready", ready_after(url, started)))
        rows += [
            ("first decision after a proxy restart", decide(url, next(tickets), tmp / "llama.log"))
        ]
        warm += [decide(url, next(tickets), tmp / "llama.log") for _ in range(args.warm)]
    finally:
        stop(proxy)
        stop(llama)
    median = statistics.median(w for w, _ in warm)
    own_median = statistics.median(o for _, o in warm)
    print(
        f"\nwarm decision (a new ticket): median {median:.3f} s of n = {len(warm)}, "
        f"range {min(w for w, _ in warm):.3f}-{max(w for w, _ in warm):.3f} s; "
        f"llama-server's own time for its reads {own_median:.3f} s"
    )
    for name, seconds in ready:
        print(f"{name:<52} {seconds:7.2f} s")
    print(f"\n{'':<44} {'waited':>8} {'/ warm':>7} {'':9} {'llama-server':>12} {'/ warm':>7}")
    for name, (waited, own) in rows:
        verdict = "ok" if waited <= 1.1 * median else "OVER 1.1x"
        print(
            f"{name:<44} {waited:7.3f} s {waited / median:6.2f}x {verdict:9} "
            f"{own:10.3f} s {own / own_median:6.2f}x"
        )


if __name__ == "__main__":
    main()
