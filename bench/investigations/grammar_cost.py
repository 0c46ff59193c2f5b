"""What does a grammar that allows only the labels cost a decision's read, and does it
change the numbers?

    .venv/bin/python bench/investigations/grammar_cost.py [--tickets 24] [--rounds 3]

Each ticket router prompt of bench/fresh.py (the call by hand with the answer cue:
instructions and options in a system turn, the ticket, ``Label:``) is evaluated once
in one slot, then read again, in turn, as a one-token replay through ``/completion``
with ``n_probs`` and a grammar allowing only the labels, and without the grammar
(rotating order, ``--rounds`` times each). Prints the p50 of each, the median paired
difference, how many prompts the model's own first choice was not a label, and whether
the top log-probabilities of the two reads were identical every time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fresh  # noqa: E402
from _machine import describe  # noqa: E402
from _servers import llama_server  # noqa: E402

from proxy.decision.labels import gbnf_alternatives  # noqa: E402

LABELS = ["A", "B", "C", "D", "E", "F"]
CUE = "\n\nLabel:"  # the answer cue after the ticket, as semif-2 sent it when this was measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tickets", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    hand = fresh.by_hand_body(fresh.ROUTER, LABELS, after=CUE)
    took: dict[str, list[float]] = {"grammar": [], "none": []}
    paired, not_a_label, identical = [], 0, True
    with llama_server() as url, httpx.Client(base_url=url, timeout=120) as client:
        for i, ticket in enumerate(fresh.LONG_TICKETS[: args.tickets]):
            messages = orjson.loads(hand(1000 + i, ticket))["messages"]
            text = client.post("/apply-template", json={"messages": messages}).json()["prompt"]
            tokens = client.post("/tokenize", json={"content": text, "add_special": True})
            base = {
                "prompt": tokens.json()["tokens"],
                "id_slot": 0,
                "cache_prompt": True,
                "n_predict": 1,
                "temperature": 0,
                "n_probs": 24,
            }
            bodies = {"grammar": {**base, "grammar": gbnf_alternatives(LABELS)}, "none": base}
            first = client.post("/completion", json=base).json()  # evaluates the prompt
            not_a_label += first["content"] not in LABELS
            for r in range(args.rounds):
                seen = {}
                for name in ("grammar", "none") if (i + r) % 2 else ("none", "grammar"):
                    start = time.perf_counter()
                    answer = client.post("/completion", json=bodies[name]).json()
                    seen[name] = time.perf_counter() - start
                    took[name].append(seen[name])
                    top = answer["completion_probabilities"][0]["top_logprobs"]
                    seen[name + "-top"] = [(e["id"], e["logprob"]) for e in top]
                paired.append((seen["grammar"] - seen["none"]) * 1e3)
                identical &= seen["grammar-top"] == seen["none-top"]
    print(describe())
    n = len(paired)
    print(f"{args.tickets} router prompts x {args.rounds} rounds: n = {n} reads each")
    for name, values in took.items():
        print(
            f"  {'with the grammar' if name == 'grammar' else 'without':18}"
            f"p50 {statistics.median(values) * 1e3:7.2f} ms"
        )
    q1, mid, q3 = statistics.quantiles(paired, n=4)
    print(
        f"  with - without, read by read: median {mid:+.2f} ms (quartiles {q1:+.2f} to {q3:+.2f})"
    )
    print(f"  the model's first choice was not a label for {not_a_label} of {args.tickets} prompts")
    print(f"  top log-probabilities identical with and without: {identical}")


if __name__ == "__main__":
    main()
