"""Repeatability: do the same questions get the same probabilities?

    .venv/bin/python bench/repeatability.py [--passes 3]          # the product
    .venv/bin/python bench/repeatability.py --under-load [--proxy-args '...']
    .venv/bin/python bench/repeatability.py --mechanism [--llama-args '-ub 512 -fa off']
    .venv/bin/python bench/repeatability.py --cuts [--llama-args '-ub 512']

Default: a fresh llama-server and proxy (as `make run` starts them), every System One
item of tests/data sent ``--passes`` times, one request at a time; prints, per pass
after the first, how many answers equal the first pass's exactly, the largest change
of a probability and how many answers changed their argmax.

``--under-load``: the same set sent twice while other traffic runs (``--load``
concurrent clients sending other decisions, and with ``--mixed`` plain chat
completions too, throughout).

``--mechanism``: straight to llama-server, no proxy: the next-token probabilities of
one prompt read cold (``cache_prompt: false``), warm (the whole prompt cached: only its
last token evaluated again) and after a cached prefix with suffixes of several lengths
evaluated as one chunk, at several prompt lengths; the largest |dp| over the top 10
tokens against the cold read. llama-server starts as ``make run`` starts it (``-ub 63``),
``--llama-args`` appended: ``-ub 512`` shows llama-server's default.
docs/repeatability.md explains the kernels behind it.

``--cuts``: what the prefix scheme (proxy/kv.py) rests on. For prompts of 95 to 1,500
tokens, the next token read after all but the last token evaluated from position 0,
then the last alone, against the same after the prompt was cut at ten places (the part
before the cut evaluated first, then the rest, then the last token alone): how many
cuts give other numbers. Run as ``make run`` starts llama-server (``-ub 63``), then
with ``--llama-args '-ub 512'`` (llama-server's default) to see the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math

import httpx
from _machine import command_line, describe
from _servers import ROOT, llama_server, proxy

DATA = ROOT / "tests" / "data"
WORDS = (
    "the parcel arrived late and the box was damaged so I want a refund for order "
    "number 1182 which I paid twice with my card last week"
).split()


def items(per_file: int | None = None) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted(DATA.glob("*.jsonl"))
        for line in [x for x in path.read_text().splitlines() if x.strip()][:per_file]
    ]


def probabilities(answers: dict) -> dict[str, dict[str, float]]:
    return {
        qid: a.get("probabilities") or {"yes": a["noul"], "no": 1 - a["noul"]}
        for qid, a in answers.items()
    }


async def ask(client: httpx.AsyncClient, url: str, item: dict) -> dict:
    """The item's answers; a 429 is retried after its Retry-After, as a client should."""
    while True:
        resp = await client.post(
            url + "/v1/systemone",
            timeout=300,
            json={"state": item["state"], "questions": item["questions"]},
        )
        if resp.status_code != 429:
            break
        await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))
    resp.raise_for_status()
    return probabilities(resp.json()["answers"])


def compare(first: list[dict], again: list[dict]) -> tuple[int, float, int, int]:
    """(identical answers, largest |dp|, argmax changes, answers) of ``again`` vs ``first``."""
    same = flips = total = 0
    largest = 0.0
    for a_item, b_item in zip(first, again, strict=True):
        for qid, a in a_item.items():
            b = b_item[qid]
            total += 1
            same += a == b
            largest = max(largest, max(abs(a[k] - b[k]) for k in a))
            flips += max(a, key=a.get) != max(b, key=b.get)
    return same, largest, flips, total


async def passes(url: str, data: list[dict], n: int) -> list[list[dict]]:
    async with httpx.AsyncClient() as client:
        return [[await ask(client, url, item) for item in data] for _ in range(n)]


async def under_load(url: str, data: list[dict], load: int, mixed: bool) -> list[list[dict]]:
    stop = asyncio.Event()

    async def other_traffic(i: int) -> None:
        async with httpx.AsyncClient() as client:
            for k in itertools.count():
                if stop.is_set():
                    return
                if mixed and k % 2:
                    await client.post(
                        url + "/v1/chat/completions",
                        timeout=300,
                        json={
                            "messages": [{"role": "user", "content": f"Say hello to client {i}."}],
                            "max_tokens": 4,
                        },
                    )
                else:
                    await ask(
                        client,
                        url,
                        {
                            "state": f"Background ticket {i}-{k}: " + " ".join(WORDS[k % 7 :]),
                            "questions": data[k % len(data)]["questions"],
                        },
                    )

    background = [asyncio.create_task(other_traffic(i)) for i in range(load)]
    try:
        return await passes(url, data, 2)
    finally:
        stop.set()
        await asyncio.gather(*background, return_exceptions=True)


def read(url: str, prompt, cache: bool, slot: int = 0) -> dict[int, float]:
    body = {
        "prompt": prompt,
        "n_predict": 1,
        "n_probs": 10,
        "temperature": 0,
        "cache_prompt": cache,
        "id_slot": slot,
    }
    out = httpx.post(url + "/completion", json=body, timeout=300).json()
    return {
        t["id"]: math.exp(t["logprob"]) for t in out["completion_probabilities"][0]["top_logprobs"]
    }


def dp(a: dict[int, float], b: dict[int, float]) -> float:
    return max(abs(a[k] - b[k]) for k in a.keys() & b.keys())


def mechanism(llama_args: list[str]) -> None:
    suffixes = (1, 2, 7, 63, 64)
    flags = "as make run" + (", then " + " ".join(llama_args) if llama_args else "")
    print(f"llama-server flags: {flags}; largest |dp| against the cold read (top 10 tokens)")
    print(
        f"  {'tokens':>7}{'cold again':>12}{'warm':>10}"
        + "".join(f"{f'+{k} chunk':>12}" for k in suffixes)
    )
    with llama_server(extra=llama_args) as url:
        for words in (40, 80, 150, 300, 600):
            text = " ".join(itertools.islice(itertools.cycle(WORDS), words)) + "\nAnswer:"
            tokens = httpx.post(url + "/tokenize", json={"content": text}).json()["tokens"]
            erase = lambda: httpx.post(url + "/slots/0?action=erase")  # noqa: E731
            erase()
            cold = read(url, tokens, False)
            erase()
            again = read(url, tokens, False)
            read(url, tokens, True)
            warm = read(url, tokens, True)
            chunks = []
            for k in suffixes:  # the prefix cached, then k tokens in one chunk
                if k >= len(tokens):
                    chunks.append(None)
                    continue
                erase()
                read(url, tokens[:-k], True)
                chunks.append(read(url, tokens, True))
            print(
                f"  {len(tokens):7d}{dp(cold, again):12.1e}{dp(cold, warm):10.1e}"
                + "".join(f"{dp(cold, c):12.1e}" if c else f"{'-':>12}" for c in chunks)
            )


def _evaluate(url: str, tokens, cache: bool, slot: int) -> None:
    httpx.post(
        url + "/completion",
        timeout=300,
        json={"prompt": tokens, "n_predict": 0, "cache_prompt": cache, "id_slot": slot},
    )


def cuts(llama_args: list[str]) -> None:
    print(
        f"llama-server flags: {' '.join(llama_args) or '(as make run)'}; cuts whose read "
        "differs from the uncut one, bit for bit (the top 10 tokens)"
    )
    with llama_server(extra=llama_args) as url:
        text = " ".join(itertools.islice(itertools.cycle(WORDS), 1400))
        every = httpx.post(url + "/tokenize", json={"content": text}).json()["tokens"]
        for n in (95, 173, 347, 700, 1500):
            tokens = every[:n]
            _evaluate(url, tokens[:-1], False, 0)
            uncut = read(url, tokens, True, 0)
            places = sorted({2, 10, 30, n // 4, n // 2, n - 70, n - 64, n - 63, n - 40, n - 3})
            differ = []
            for cut in places:
                _evaluate(url, tokens[:cut], False, 1)
                _evaluate(url, tokens[:-1], True, 1)
                if read(url, tokens, True, 1) != uncut:
                    differ.append(cut)
            print(
                f"  {n:5d} tokens: {len(differ)} of {len(places)} cuts differ"
                + (f" (at {differ})" if differ else "")
            )


def report(runs: list[list[dict]], label: str) -> None:
    for i, again in enumerate(runs[1:], start=2):
        same, largest, flips, total = compare(runs[0], again)
        print(
            f"  {label} pass {i} vs pass 1: {same}/{total} answers identical, largest |dp| "
            f"{largest:.2e}, argmax changed in {flips}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--per-file", type=int, help="only the first N items of each set")
    parser.add_argument("--under-load", action="store_true")
    parser.add_argument("--load", type=int, default=4, help="concurrent background clients")
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="the background clients send plain chat completions too",
    )
    parser.add_argument("--mechanism", action="store_true")
    parser.add_argument("--cuts", action="store_true", help="what the prefix scheme rests on")
    parser.add_argument("--llama-args", default="", help="extra llama-server flags, one string")
    parser.add_argument("--proxy-args", default="", help="extra proxy flags, one string")
    args = parser.parse_args()
    print(command_line())
    print(
        {
            k: v
            for k, v in describe().items()
            if k in ("date", "cpu", "cpu_level", "cores", "llama_server_version", "model")
        }
    )
    if args.mechanism:
        mechanism(args.llama_args.split())
        return
    if args.cuts:
        cuts(args.llama_args.split())
        return
    data = items(args.per_file)
    with (
        llama_server(extra=args.llama_args.split()) as llama_url,
        proxy(llama_url, args.proxy_args.split()) as url,
    ):
        if args.under_load:
            print(
                f"{len(data)} items sent twice while {args.load} other clients send "
                f"decisions{' and chat' if args.mixed else ''}; proxy flags "
                f"{args.proxy_args or '(defaults)'}"
            )
            report(asyncio.run(under_load(url, data, args.load, args.mixed)), "under load,")
        else:
            print(
                f"{len(data)} items of {DATA.relative_to(ROOT)}, {args.passes} passes, one "
                "request at a time, on a freshly started llama-server and proxy"
            )
            report(asyncio.run(passes(url, data, args.passes)), "")


if __name__ == "__main__":
    main()
