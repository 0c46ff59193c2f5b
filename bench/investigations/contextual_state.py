"""Contextual calibration about a long state: does a question's content-free read make
the next question evaluate the state again?

    .venv/bin/python bench/investigations/contextual_state.py [--before DIR] [--rounds 1]
        [--paragraphs 66]

One System One request with bench/shared_state.py's 16 questions about a fresh state of
about 1,000 tokens and ``x_debias: contextual``, sent to a proxy that has answered no
such request yet (no content-free answer is remembered: each question reads one), then
a second request about another fresh state (the content-free answers remembered). For
each, the time, the reads and the prompt tokens llama-server evaluated (``usage``:
input less cached). The proxy as it is, and with ``--before`` the proxy of another
checkout (for example ``git worktree add /tmp/before 80a7a93``; run with this
``.venv``), each in front of a llama-server of its own started as make run starts it,
``--rounds`` times, in alternating order.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: the shared helpers

import shared_state  # noqa: E402
from _machine import describe  # noqa: E402
from _servers import ROOT, _serving, _settle, llama_server  # noqa: E402

from scripts.stack import CONNECTIONS, UBATCH, start_proxy  # noqa: E402


def ask(url: str) -> str:
    """One request: its seconds, reads and prompt tokens evaluated, or its status."""
    body = {
        "state": shared_state.fresh_state(),
        "questions": shared_state.QUESTIONS,
        "x_debias": "contextual",
    }
    started = time.perf_counter()
    resp = httpx.post(url + "/v1/systemone", json=body, timeout=600)
    took = time.perf_counter() - started
    if resp.status_code != 200:
        return f"{took:6.2f} s, {resp.status_code}: {resp.text[:200]}"
    answer = resp.json()
    usage = answer["usage"]
    reads = sum(a["x_reads"] for a in answer["answers"].values())
    evaluated = usage["input_tokens"] - usage["x_cached_input_tokens"]
    return f"{took:6.2f} s, {reads} reads, {evaluated} prompt tokens evaluated"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout of the other code")
    parser.add_argument("--paragraphs", type=int, default=66, help="the state's length")
    parser.add_argument("--rounds", type=int, default=1, help="each checkout this often")
    args = parser.parse_args()
    shared_state.PARAGRAPHS_IN_STATE[0] = args.paragraphs
    checkouts = [("now", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    print(describe())
    turns = [c for i in range(args.rounds) for c in (checkouts if i % 2 == 0 else checkouts[::-1])]
    for name, checkout in turns:
        with (
            llama_server() as upstream,
            _serving(
                lambda port, log, checkout=checkout, upstream=upstream: start_proxy(
                    port,
                    upstream,
                    log=log,
                    ubatch=UBATCH,
                    connections=CONNECTIONS,
                    cwd=checkout,
                ),
                timeout_s=60,
            ) as (url, _),
        ):
            _settle(url)
            for which in ("first request", "second request"):
                print(f"{name:6} {which}: {ask(url)}", flush=True)


if __name__ == "__main__":
    main()
