"""Prompt-processing speed of the llama-server we ship against the alternative,
side by side in one run: the prebuilt wheel of b10434 (default) and llama.cpp
b11434 built from source with the fastest flags that run on these machines.

    .venv/bin/python bench/llama_builds.py [--rounds 6]

Both servers are started at once and asked in turn (never together), each for
the same ~740-token prompt with the prompt cache off, so every round re-reads
the whole prompt. Prints the median prompt tokens/s of each and the ratio.
The source build is compiled once on first use (about 7 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import httpx
from _servers import llama_server

from scripts.prepare import ensure_llama_server

PARAGRAPH = (
    "A customer writes that the parcel with their order arrived late, the box was "
    "damaged, and the invoice shows a charge for express delivery they never chose. "
)
PROMPT = PARAGRAPH * 22 + "Which team should handle this ticket?"


def prompt_speed(url: str) -> tuple[float, int]:
    body = {"prompt": PROMPT, "n_predict": 1, "cache_prompt": False, "temperature": 0}
    timings = httpx.post(url + "/completion", json=body, timeout=300).json()["timings"]
    return timings["prompt_per_second"], timings["prompt_n"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    builds = {
        "wheel b10434 (shipped)": ensure_llama_server(source=False),
        "source b11434 AVX2": ensure_llama_server(source=True),
    }
    speeds: dict[str, list[float]] = {name: [] for name in builds}
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(llama_server(path)) for name, path in builds.items()}
        n_tokens = 0
        for url in urls.values():  # warm-up round, not counted
            _, n_tokens = prompt_speed(url)
        for i in range(args.rounds):
            order = list(urls) if i % 2 == 0 else list(reversed(urls))
            for name in order:
                speeds[name].append(prompt_speed(urls[name])[0])
    print(f"prompt of {n_tokens} tokens, cache off, {args.rounds} interleaved rounds")
    medians = {name: statistics.median(v) for name, v in speeds.items()}
    for name, med in medians.items():
        spread = f"{min(speeds[name]):.0f}-{max(speeds[name]):.0f}"
        print(f"  {name:26} {med:8.1f} tokens/s  (range {spread})")
    shipped, other = medians.values()
    print(f"  ratio shipped / source     {shipped / other:8.2f}")


if __name__ == "__main__":
    main()
