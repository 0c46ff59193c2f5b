"""How fast does llama-server evaluate a long prompt at each physical batch size (-ub)?

    .venv/bin/python bench/investigations/ubatch_speed.py [--ub 63,60,56,48,32,512] [--reads 3]
                                                      [--variant FLAGS ...] [--repeat N]

For each ``-ub``, a llama-server started as ``make run`` starts it but for that ``-ub``
reads bench/shared_state.py's ~1,000-token state cold (``cache_prompt: false``, one
token generated) ``--reads`` times, after one warm-up read; prints the median of the
prompt evaluation speed llama-server itself reports (``timings.prompt_per_second``).
The prefix scheme needs ``-ub`` of at most 63 (docs/repeatability.md): does a smaller
one cost less than 63?

``--variant``: each ``-ub`` also with these llama-server flags (for example ``"-fa
off"``, flash attention off, or ``"-ctk f32 -ctv f32"``, an F32 KV cache), right after
it; ``--repeat``: the whole sequence that many times, so that each configuration is
measured in turns with the others.
"""

from __future__ import annotations

import argparse
import shlex
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
    parser.add_argument(
        "--variant", action="append", default=[], help="more llama-server flags, in quotes"
    )
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print(describe())
    prompt = fresh_state()
    for _ in range(args.repeat):
        for ub in args.ub.split(","):
            for variant in ["", *args.variant]:
                with llama_server(extra=["-ub", ub, *shlex.split(variant)]) as url:
                    n, per_s = speeds(url, prompt, args.reads)
                median, spread = statistics.median(per_s), f"{min(per_s):.0f}-{max(per_s):.0f}"
                name = f"-ub {ub:>4} {variant}".rstrip()
                print(f"  {name:<28}: {median:6.1f} tokens/s (reads {spread}; {n} tokens)")


if __name__ == "__main__":
    main()
