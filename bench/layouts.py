"""The two chat layouts (``semif.layout``) side by side on the labelled sets of tests/data:
what each costs and how well its probabilities do.

    .venv/bin/python bench/layouts.py [--per-file N]

Every item (a state and one question with its gold answer) is asked as a chat decision:
the question's instructions as the caller's system turn, the state as the user turn,
the options in ``semif``, once in each layout (in alternating order), on a freshly
started llama-server and proxy, one request at a time. Prints per layout: accuracy, ECE
(10 bins) and the mean label mass, each with a 95% bootstrap interval over the items
(seeded: the same answers give the same interval), the p50 latency and the mean tokens
llama-server evaluated per request. With the tiny default model expect noise: the
intervals say how much.
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx
from _machine import command_line, describe
from _servers import ROOT, llama_server, proxy

from semif_tools.calibrate.dataset import Item, load_items
from semif_tools.calibrate.scores import accuracy, expected_calibration_error
from semif_tools.calibrate.stats import bootstrap_interval

LAYOUTS = ("conversation_first", "options_first")


def chat_body(item: Item, layout: str) -> dict:
    question = item.body["questions"][item.qid]
    semif = {"type": question["type"], "layout": layout}
    if question.get("criteria") is not None:
        semif["options"] = question["criteria"]
    head = (
        [{"role": "system", "content": question["instructions"]}]
        if question.get("instructions")
        else []
    )
    return {"messages": [*head, {"role": "user", "content": item.body["state"]}], "semif": semif}


def ask(client: httpx.Client, url: str, item: Item, layout: str) -> dict:
    started = time.perf_counter()
    resp = client.post(url + "/v1/chat/completions", json=chat_body(item, layout))
    took = time.perf_counter() - started
    resp.raise_for_status()
    body = resp.json()
    answer, usage = body["semif"], body["usage"]
    probs = answer["probabilities"]
    return {
        "probs": [float(probs[name]) for name in item.names],
        "mass": answer["label_mass"],
        "seconds": took,
        "evaluated": usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"],
    }


def summarise(items: list[Item], reads: list[dict]) -> dict[str, object]:
    golds = [item.gold for item in items]
    probs = [r["probs"] for r in reads]

    def on(statistic):
        return lambda idx: statistic([probs[i] for i in idx], [golds[i] for i in idx])

    mass = bootstrap_interval(
        lambda idx: statistics.fmean(reads[i]["mass"] for i in idx), len(reads)
    )
    return {
        "accuracy": bootstrap_interval(on(accuracy), len(reads)),
        "ece": bootstrap_interval(on(expected_calibration_error), len(reads)),
        "label mass": mass,
        "p50 ms": statistics.median(r["seconds"] for r in reads) * 1e3,
        "evaluated": statistics.fmean(r["evaluated"] for r in reads),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-file", type=int, default=None, help="the first N of each set")
    args = parser.parse_args()
    paths = sorted((ROOT / "tests" / "data").glob("*.jsonl"))
    items = [item for path in paths for item in load_items([path], args.per_file)]
    reads: dict[str, list[dict]] = {layout: [] for layout in LAYOUTS}
    with llama_server() as llama_url, proxy(llama_url) as url, httpx.Client(timeout=300) as client:
        for i, item in enumerate(items):
            for layout in LAYOUTS if i % 2 == 0 else LAYOUTS[::-1]:
                reads[layout].append(ask(client, url, item, layout))
    print(command_line())
    print(describe())
    print(f"{len(items)} items of tests/data, each asked in both layouts, one at a time")
    for layout, done in reads.items():
        s = summarise(items, done)
        figures = "; ".join(
            f"{name} {iv.value:.3f} [{iv.low:.3f}, {iv.high:.3f}]"
            for name, iv in s.items()
            if hasattr(iv, "low")
        )
        print(
            f"  {layout:19} {figures}; p50 {s['p50 ms']:.0f} ms; "
            f"{s['evaluated']:.0f} tokens evaluated per request (n = {len(done)})"
        )


if __name__ == "__main__":
    main()
