"""Does one System One request with 16 questions evaluate more than the same 16 questions
sent one after another?

    .venv/bin/python bench/investigations/state_reads.py [--rounds 3]

On one llama-server and proxy as ``make run`` starts them, bench/shared_state.py's 16
questions about a fresh ~1,000-token state, alternately as one request and as 16
requests in turn (``--rounds`` times each, after one warm-up request). For each, the
time and what llama-server's ``/metrics`` counted meanwhile: prompt tokens evaluated
(``llamacpp:prompt_tokens_total``) and batches (``llamacpp:n_decode_total``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _machine import describe  # noqa: E402
from _servers import llama_server, proxy  # noqa: E402
from shared_state import fresh_state, one_request, separate  # noqa: E402


async def counted(session: aiohttp.ClientSession, llama_url: str) -> tuple[float, float]:
    async with session.get(llama_url + "/metrics") as r:
        text = await r.text()
    tokens = re.search(r"^llamacpp:prompt_tokens_total (\S+)", text, re.M)
    batches = re.search(r"^llamacpp:n_decode_total (\S+)", text, re.M)
    assert tokens and batches, "llama-server's /metrics lacks its counters"
    return float(tokens.group(1)), float(batches.group(1))


async def measure(llama_url: str, proxy_url: str, rounds: int) -> None:
    url = proxy_url + "/v1/systemone"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await one_request(session, url, fresh_state())  # warm-up: the self-check, labels
        variants = {
            "one request": lambda state: one_request(session, url, state),
            "16 in turn": lambda state: separate(session, url, state, False),
        }
        for _ in range(rounds):
            for name, send in variants.items():
                before = await counted(session, llama_url)
                seconds = await send(fresh_state())
                after = await counted(session, llama_url)
                print(
                    f"  {name:12} {seconds:6.2f} s  prompt tokens {after[0] - before[0]:6.0f}"
                    f"  batches {after[1] - before[1]:4.0f}",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(describe())
    with llama_server() as llama_url, proxy(llama_url) as proxy_url:
        asyncio.run(measure(llama_url, proxy_url, args.rounds))


if __name__ == "__main__":
    main()
