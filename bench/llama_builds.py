"""The llama-server chosen for this machine beside every alternative already in the cache,
prompt processing side by side in one run.

    .venv/bin/python bench/llama_builds.py [--rounds 6]

Nothing is fetched or built for the comparison: the candidates of
``scripts/choose.py`` that are present under ``$SEMIF_CACHE`` are each probed
first (a build that dies on this CPU is listed with the reason), then the ones
that run are started at once and asked in turn (never together, the order
alternating by round), each for the same ~740-token prompt with the prompt
cache off, so every round re-reads the whole prompt. Prints the median prompt
tokens/s of each and its ratio to the chosen build, and the machine's CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path

import httpx
from _servers import llama_server, model_path

from scripts.choose import candidates
from scripts.cpu import level, read_cpu
from scripts.prepare import choose_llama_server
from scripts.probe import probe

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
    cpu = read_cpu()
    chosen = choose_llama_server()
    model = model_path()
    print(f"CPU: {cpu.model or cpu.arch} ({level(cpu)}), chosen: {chosen.label}")
    running: dict[str, Path] = {}
    for cand in candidates(cpu):
        binary = cand.present()
        if binary is None:
            print(f"  {cand.label:55} not in the cache (not built for a comparison)")
            continue
        result = probe(binary, model, args=cand.args, needs=cand.needs, has=level(cpu))
        if result.ok:
            running[cand.label] = binary
        else:
            print(f"  {cand.label:55} does not run here: {result.reason}")
    speeds: dict[str, list[float]] = {name: [] for name in running}
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(llama_server(path)) for name, path in running.items()}
        n_tokens = 0
        for url in urls.values():  # warm-up round, not counted
            _, n_tokens = prompt_speed(url)
        for i in range(args.rounds):
            order = list(urls) if i % 2 == 0 else list(reversed(urls))
            for name in order:
                speeds[name].append(prompt_speed(urls[name])[0])
    print(f"prompt of {n_tokens} tokens, cache off, {args.rounds} interleaved rounds")
    medians = {name: statistics.median(v) for name, v in speeds.items()}
    base = medians.get(chosen.label)
    for name, med in medians.items():
        spread = f"{min(speeds[name]):.0f}-{max(speeds[name]):.0f}"
        ratio = f"{med / base:5.2f}x the chosen" if base else ""
        mark = "*" if name == chosen.label else " "
        print(f"{mark} {name:55} {med:7.1f} tokens/s (range {spread}) {ratio}")


if __name__ == "__main__":
    main()
