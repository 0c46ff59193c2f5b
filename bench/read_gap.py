"""llama-server's compute of a read against the time since its previous answer.

    .venv/bin/python bench/read_gap.py [--rounds 15]

Sends the decision read of bench/overhead.py straight to llama-server, one at a
time, in interleaved blocks (their order rotating) that differ only in what the
client does before each request: nothing (back to back), sleep 0.5, 1 or 2 ms,
or spin the CPU for 1 ms. Prints the median round trip and llama-server's own
``timings.prompt_ms`` for each, and their ratio to back to back.

Why: a hop adds time between llama-server's answer and the next request at
concurrency 1: its own work (in bench/critical_path.py's stages, about 0.25 ms
for bench/_relay.py's bare hop and 0.5 ms for the proxy) and two more hand-offs
between processes. If llama-server computes a read that comes later more
slowly, a hop costs more than its own time, and the direct baseline (a local
client sending back to back) is the fastest case there is.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import llama_server, proxy  # noqa: E402
from critical_path import prompt_ms  # noqa: E402
from overhead import PATH, decision_labels, direct_body, rotated  # noqa: E402

# (label, seconds asleep, seconds spinning) before each request
BEFORE = [("back to back", 0.0, 0.0), ("sleep 0.5 ms", 0.0005, 0.0),
          ("sleep 1 ms", 0.001, 0.0), ("sleep 2 ms", 0.002, 0.0), ("spin 1 ms", 0.0, 0.001)]


async def measure(url: str, body: bytes, rounds: int, per_block: int = 40
                  ) -> dict[str, list[tuple[float, float]]]:
    """Each way's (round trip, prompt_ms) in microseconds."""
    out: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in BEFORE}
    async with aiohttp.ClientSession() as session:
        for i in range(rounds):
            for label, asleep, spinning in rotated(BEFORE, i):
                for _ in range(per_block):
                    if asleep:
                        time.sleep(asleep)  # the whole client waits, as a slow one would
                    end = time.perf_counter() + spinning
                    while time.perf_counter() < end:
                        pass
                    t0 = time.perf_counter()
                    async with session.post(url + PATH, data=body) as r:
                        answer = await r.read()
                        assert r.status == 200, r.status
                    took = time.perf_counter() - t0
                    out[label].append((took * 1e6, prompt_ms(answer) * 1e3))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="blocks of 40 per way")
    args = parser.parse_args()
    with llama_server() as llama_url, proxy(llama_url) as proxy_url:
        body = direct_body(asyncio.run(decision_labels(proxy_url)))
        results = asyncio.run(measure(llama_url, body, args.rounds))
    base = {k: statistics.median(v[k] for v in results["back to back"]) for k in (0, 1)}
    print(f"concurrency 1, {args.rounds * 40} reads each, medians in µs (ratio to back to back)")
    print(f"  {'before each request':22}{'round trip':>20}{'prompt_ms':>20}")
    for label, reads in results.items():
        cells = [statistics.median(r[k] for r in reads) for k in (0, 1)]
        print(f"  {label:22}"
              + "".join(f"{c:13.0f} ({c / base[k]:.3f})" for k, c in enumerate(cells)))


if __name__ == "__main__":
    main()
