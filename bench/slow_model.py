"""The slow model's prompt speed beside the default model's, from llama-server's own timings,
the two read in turns in one run.

    .venv/bin/python bench/slow_model.py [--blocks 8] [--rounds 5] [--tickets 6]

Two llama-servers, started as `make run` starts them (scripts/stack.py's flags): one on the
default model, one on the slow model with its blocks run ``--blocks`` times
(scripts/slow_model.py, made if missing; docs/slow-model.md). Each round sends one prompt
to each, one at a time (the other idles), with no prompt cache: ``--tickets`` tickets of
tests/data/tickets.jsonl, about 25 tokens each, as one ``/completion`` of one token. After
one read each that is not counted, prints each model's file size, resident memory, the
prompt's tokens and the median of llama-server's ``prompt_per_second``, and its ratio to
the default model's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys

import httpx
from _machine import describe, rss_kb
from _servers import ROOT, llama_server_process

from scripts.prepare import ensure_model
from scripts.slow_model import ensure_slow_model


def _prompt(tickets: int) -> str:
    lines = (ROOT / "tests" / "data" / "tickets.jsonl").read_text().splitlines()[:tickets]
    return "\n".join(json.loads(line)["state"] for line in lines)


def _read(url: str, prompt: str) -> tuple[int, float]:
    """The prompt's tokens and llama-server's prompt tokens per second for one cold read."""
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": False}
    timings = httpx.post(url + "/completion", json=body, timeout=600).json()["timings"]
    return int(timings["prompt_n"]), float(timings["prompt_per_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8, help="the slow model's K (default 8)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tickets", type=int, default=6, help="tickets in the prompt")
    args = parser.parse_args()
    models = {"default": ensure_model(), f"slow K={args.blocks}": ensure_slow_model(args.blocks)}
    prompt = _prompt(args.tickets)
    with contextlib.ExitStack() as stack:
        served = {
            name: stack.enter_context(llama_server_process(model=path))
            for name, path in models.items()
        }
        for url, _ in served.values():
            _read(url, prompt)  # not counted: the first read pages the model in
        speeds: dict[str, list[float]] = {name: [] for name in served}
        tokens = 0
        for _ in range(args.rounds):
            for name, (url, _) in served.items():
                tokens, speed = _read(url, prompt)
                speeds[name].append(speed)
        rss = {name: rss_kb(proc.pid) / 1024 for name, (_, proc) in served.items()}
    base = statistics.median(speeds["default"])
    print(describe())
    print(f"prompt: {tokens} tokens, no prompt cache; median of {args.rounds} rounds")
    print(f"{'model':<12} {'file':<38} {'MB':>6} {'RSS MB':>7} {'tok/s':>7} {'ratio':>6}")
    for name, path in models.items():
        median = statistics.median(speeds[name])
        size = path.stat().st_size / 1e6
        print(
            f"{name:<12} {path.name:<38} {size:6.0f} {rss[name]:7.0f} {median:7.1f} "
            f"{median / base:6.3f}"
        )


if __name__ == "__main__":
    sys.exit(main())
