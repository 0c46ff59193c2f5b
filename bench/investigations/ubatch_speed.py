"""How fast does llama-server evaluate a long prompt at each physical batch size (-ub)?

    .venv/bin/python bench/investigations/ubatch_speed.py [--ub 63,60,56,48,32,512] [--reads 3]

For each ``-ub``, a llama-server started as ``make run`` starts it but for that ``-ub``
reads bench/shared_state.py's ~1,000-token state cold (``cache_prompt: false``, one
token generated) ``--reads`` times, after one warm-up read; prints the median of the
prompt evaluation speed llama-server itself reports (``timings.prompt_per_second``).
The prefix scheme needs ``-ub`` of at most 63 (docs/repeatability.md): does a smaller
one cost less than 63?
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _machine import describe  # noqa: E402
from _servers import llama_server  # noqa: E402
from shared_state import fresh_state  # noqa: E402


def speeds(url: str, prompt: str, reads: int) -> tuple[int, list[float]]:
    body = {"prompt": prompt, "n_predict": 1, "cache_prompt": False, "temperature": 0}
    out = []
    with httpx.Client(timeout=600) as client:
        for i in range(reads + 1):
            resp = client.post(url + "/completion", json=body)
            resp.raise_for_status()
            timings = resp.json()["timings"]
            if i:  # the first read warms up
                out.append(timings["prompt_per_second"])
    return timings["prompt_n"], out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ub", default="63,60,56,48,32,512", help="comma-separated -ub values")
    parser.add_argument("--reads", type=int, default=3)
    args = parser.parse_args()
    print(describe())
    prompt = fresh_state()
    for ub in args.ub.split(","):
        with llama_server(extra=["-ub", ub]) as url:
            n, per_s = speeds(url, prompt, args.reads)
        median, spread = statistics.median(per_s), f"{min(per_s):.0f}-{max(per_s):.0f}"
        print(f"  -ub {ub:>4}: {median:6.1f} tokens/s (reads {spread}; {n} tokens)")


if __name__ == "__main__":
    main()
