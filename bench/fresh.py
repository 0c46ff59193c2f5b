"""Decisions on conversations llama-server has not seen: through the proxy against the
same one-token read sent straight to llama-server's chat endpoint, interleaved in one
run, at concurrency 1 and 8.

    .venv/bin/python bench/fresh.py [--rounds 5] [--tickets N]   # tickets, the default layout
    .venv/bin/python bench/fresh.py --routing [--rounds 5]       # a ticket router
    MODEL=$(make -s slow-model) .venv/bin/python bench/fresh.py --tickets 8 --rounds 3 \
        --llama-args '-c 8192' --deadline 300                    # at a real model's speed

bench/overhead.py measures a replay: one prompt sent again and again, which the
slot's cache serves. Here every request is a new conversation (each ticket of
tests/data/tickets.jsonl, numbered afresh each time it is sent, so no two requests
share more than the chat template's opening and the first digits of that number),
which is what most decision traffic is. Targets, each with the requests it sends:

- ``proxy``: the decision through the proxy (its repeatable read, proxy/kv.py);
- ``chat``: llama-server's chat endpoint reading the prompt text the proxy builds
  (the same messages, options block included), one request;
- ``one-token``: a one-token read (a replay of one prompt through ``/completion``),
  the step a repeatable read cannot always skip: the proxy's budget over ``chat`` is
  one of these plus 2 ms.

``--routing``: one classifier (six options with a one-sentence description each,
about 200 tokens with its instructions) over new tickets of 60 to 120 tokens (four
tickets of tests/data joined). ``proxy`` asks with ``"layout": "options_first"``;
``chat`` reads the conventional layout (options after the ticket, as System One
clients and sidecars send it); ``by-hand`` is the best call a user could write to
the chat endpoint: instructions and options in a system turn (which llama-server's
slot keeps), the ticket as the user turn, a one-token grammar and logprobs.
Budgets: the proxy at least 1.5x faster than ``chat``, and no slower than ``by-hand``
plus one one-token read.

``--stock``: one more target, the chat endpoint's read (``chat-512``; by hand with
``--routing``: ``hand-512``) on a llama-server with its default physical batch of 512
instead of make run's 63: what a user who wants no repeatability gets, so the price of
``-ub 63`` (docs/repeatability.md) shows beside the budgets. Reported, not budgeted.

``--segment``: every llama-server at its default physical batch (``-ub 512``) and the
proxy told nothing of it, so it reads by the segment scheme (docs/repeatability.md): the
budgets on servers started alike, as a deployment would run the proxy beside a stock
llama-server.

Each target has a llama-server of its own, started as `make run` starts it. On one shared
server, requests not pinned to a slot (every target's but the proxy's) went to the slot
llama-server picks (the most similar prompt, else the one used longest ago), at times
the one another target had just filled: that target then evaluated its fixed part again
(the router's proxy at concurrency 1: mean 656 ms against p50 598 ms at c098185).

Prints, per concurrency, p50, mean, p90 and throughput of each target over all rounds (each
round sends every ticket once to each target, in rotating order: at concurrency 1 ticket
by ticket, above it target by target), the ratios with the lowest and highest round's,
and whether each budget holds. At concurrency 1 also the proxy's latency minus each
other target's for the same ticket; above it the ratio of mean latencies (with a fixed
number of requests in flight the mean is that number over the throughput, so it moves
with the throughput; the p50 also moves with the order in which queued requests start).
(Sent target by target at concurrency 1, each target's rounds met the machine's drift at
their own times: the p50 difference of three runs of one command moved from -21 to +57
ms; docs/performance.md.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import shlex
import statistics

import aiohttp
import httpx
import orjson
from _machine import describe
from _servers import ROOT, STOCK, llama_server_process, proxy_process
from overhead import PATH, pct, rotated, send_all

from proxy.decision.labels import gbnf_alternatives
from proxy.decision.prompt import ANSWER_INSTRUCTION, lay_out, options_block
from proxy.decision.question import choice_question
from scripts.stack import UBATCH

_SETS = [
    json.loads(line)["state"]
    for line in (ROOT / "tests" / "data" / "tickets.jsonl").read_text().splitlines()
]
TICKETS = _SETS
LONG_TICKETS = [" ".join(_SETS[i : i + 4]) for i in range(0, len(_SETS) - 3, 2)]
OPTIONS = {
    "billing": "charges, refunds, invoices",
    "shipping": "delivery and parcels",
    "technical": "bugs, crashes, log-in problems",
    "other": None,
}
ROUTER = {
    "billing": "The customer asks about a charge, a refund, an invoice or a payment method.",
    "shipping": "The customer asks where a parcel is, when it arrives or how to return it.",
    "technical": "The customer reports an error, a crash, a slow page or a failed log-in.",
    "account": "The customer wants to change a profile, an address, a password or to leave.",
    "sales": "The customer asks about prices, plans, discounts or buying more of something.",
    "other": "Anything that none of the teams above would handle, including praise and spam.",
}
INSTRUCTIONS = (
    "You route customer support tickets to the one team that should answer them. "
    "Read the ticket and choose the team."
)


def conversation(number: int, ticket: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Ticket {number}: {ticket}"}]


def proxy_body(options: dict, layout: str | None = None, system: str | None = None):
    """The decision through the proxy; ``system``: the caller's own system turn (with
    ``options_first`` the options block goes before its text, in the same turn)."""
    semif = {"options": options, **({"layout": layout} if layout else {})}
    head = [{"role": "system", "content": system}] if system else []
    return lambda number, ticket: orjson.dumps(
        {"messages": [*head, *conversation(number, ticket)], "semif": semif}
    )


def _read(messages: list[dict], labels: list[str]) -> bytes:
    return orjson.dumps(
        {
            "messages": messages,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": max(16, 4 * len(labels)),
            "grammar": gbnf_alternatives(labels),
            "cache_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )


def chat_body(options: dict, labels: list[str], layout: str, instructions: str | None = None):
    """The chat-endpoint read of the prompt text the proxy builds in ``layout``."""
    block = options_block(choice_question(options, instructions=instructions), labels)
    return lambda number, ticket: _read(
        lay_out(conversation(number, ticket), block, layout), labels
    )


def by_hand_body(options: dict, labels: list[str], after: str = ""):
    """What a user would write: the classifier in a system turn, the ticket as the user
    (``after`` appended to it: bench/investigations/grammar_cost.py's answer cue)."""
    lines = "\n".join(
        f"{label}: {name} - {desc}" for label, (name, desc) in zip(labels, options.items())
    )
    system = f"{INSTRUCTIONS}\n\nTeams:\n{lines}\n\n{ANSWER_INSTRUCTION}"
    return lambda number, ticket: _read(
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Ticket {number}: {ticket}{after}"},
        ],
        labels,
    )


def one_token_body(llama_url: str):
    """A one-token read: a prompt llama-server's slot already holds, read again."""
    with httpx.Client(base_url=llama_url, timeout=60) as client:
        tokens = client.post(
            "/tokenize", json={"content": "Ticket: " + TICKETS[0], "add_special": True}
        ).json()["tokens"]
    body = orjson.dumps(
        {"prompt": tokens, "n_predict": 1, "temperature": 0, "n_probs": 16, "cache_prompt": True}
    )
    return lambda number, ticket: body


async def labels_of(proxy_url: str, body: bytes) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy_url + PATH, data=body) as r:
            answer = (await r.json())["semif"]
    assert answer["reads"] == 1, "the decision needed a wider read: not one call to compare"
    return list(answer["labels"].values())


async def measure(
    targets, tickets, rounds: int, concurrency: int, numbers, deadline_s: float = 0.0
) -> dict[str, list]:
    """Per target, one (latencies, wall time) per round. At concurrency 1 each ticket goes
    to every target in turn (rotating order) before the next ticket, so the targets'
    latencies pair ticket by ticket and drift between tickets falls on all of them; the
    wall time is then the sum of the latencies. Above 1, each target sends the round's
    tickets in one block."""
    out: dict[str, list] = {name: [] for name in targets}
    # --deadline: every request asks for it (llama-server ignores the header)
    headers = {"X-Semif-Deadline": f"{deadline_s:g}"} if deadline_s else None
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=64), headers=headers
    ) as session:
        for i in range(rounds):
            if concurrency == 1:
                latencies: dict[str, list[float]] = {name: [] for name in targets}
                for j, ticket in enumerate(tickets):
                    for name in rotated(list(targets), i + j):
                        url, make = targets[name]
                        (took,), _ = await send_all(session, url, [make(next(numbers), ticket)], 1)
                        latencies[name].append(took)
                for name, lat in latencies.items():
                    out[name].append((lat, sum(lat)))
                continue
            for name in rotated(list(targets), i):
                url, make = targets[name]
                bodies = [make(next(numbers), ticket) for ticket in tickets]
                out[name].append(await send_all(session, url, bodies, concurrency))
    return out


def report(results: dict[int, dict[str, list]], budgets) -> None:
    for concurrency, measured in results.items():
        print(f"\nconcurrency {concurrency}")
        print(f"  {'':10}{'p50 ms':>10}{'mean ms':>10}{'p90 ms':>10}{'req/s':>10}")
        rows, means = {}, {}
        for name, rounds in measured.items():
            latencies = [t for lat, _ in rounds for t in lat]
            rows[name] = (
                statistics.median(latencies) * 1e3,
                len(latencies) / sum(wall for _, wall in rounds),
            )
            means[name] = statistics.fmean(latencies) * 1e3
            print(
                f"  {name:10}{rows[name][0]:10.1f}{means[name]:10.1f}"
                f"{pct(latencies, 90) * 1e3:10.1f}{rows[name][1]:10.2f}"
            )
        per_round = {
            name: [(statistics.median(lat) * 1e3, len(lat) / wall) for lat, wall in rounds]
            for name, rounds in measured.items()
        }
        for other in (n for n in measured if n not in ("proxy", "one-token")):
            for k, what in ((0, "p50"), (1, "throughput")):
                ratios = [p[k] / c[k] for p, c in zip(per_round["proxy"], per_round[other])]
                print(
                    f"  proxy/{other} {what}: {rows['proxy'][k] / rows[other][k]:.3f} "
                    f"(rounds {min(ratios):.3f}-{max(ratios):.3f})"
                )
        if concurrency > 1:  # a closed loop: mean latency = concurrency / throughput
            for other in (n for n in measured if n not in ("proxy", "one-token")):
                print(f"  proxy/{other} mean latency: {means['proxy'] / means[other]:.3f}")
        if concurrency == 1:  # the same ticket through each target, one after the other
            for other in (n for n in measured if n not in ("proxy", "one-token")):
                diffs = [
                    (p - c) * 1e3
                    for (mine, _), (theirs, _) in zip(measured["proxy"], measured[other])
                    for p, c in zip(mine, theirs)
                ]
                q1, mid, q3 = statistics.quantiles(diffs, n=4)
                print(
                    f"  proxy - {other}, ticket by ticket: median {mid:+.1f} ms "
                    f"(quartiles {q1:+.1f} to {q3:+.1f}; n = {len(diffs)})"
                )
        for line in budgets(rows, concurrency):
            print("  " + line)


def _fresh_budgets(rows, concurrency):
    (proxy, proxy_rps), (chat, chat_rps), (one, _) = rows["proxy"], rows["chat"], rows["one-token"]
    yield (
        f"budget p50: proxy - chat = {proxy - chat:.1f} ms, at most one-token + 2 = "
        f"{one + 2:.1f} ms: {'holds' if proxy - chat <= one + 2 else 'MISSED'}"
    )
    yield (
        f"budget throughput: {proxy_rps / chat_rps:.3f} of chat, at least 0.95: "
        f"{'holds' if proxy_rps >= 0.95 * chat_rps else 'MISSED'}"
    )


def _routing_budgets(rows, concurrency):
    (proxy, proxy_rps), (chat, chat_rps) = rows["proxy"], rows["chat"]
    (hand, _), (one, _) = rows["by-hand"], rows["one-token"]
    faster, rate = chat / proxy, proxy_rps / chat_rps
    yield (
        f"budget: {faster:.2f}x faster than chat at p50 and {rate:.2f}x in throughput, "
        f"at least 1.5x: {'holds' if min(faster, rate) >= 1.5 else 'MISSED'}"
    )
    yield (
        f"budget: proxy p50 {proxy:.1f} ms, at most by-hand + one-token = "
        f"{hand + one:.1f} ms: {'holds' if proxy <= hand + one else 'MISSED'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--routing", action="store_true", help="the ticket-router workload")
    parser.add_argument(
        "--stock",
        action="store_true",
        help="also the chat endpoint (by hand with --routing) on a llama-server at -ub 512",
    )
    parser.add_argument(
        "--segment",
        action="store_true",
        help="every llama-server at -ub 512, the proxy told nothing: the segment scheme",
    )
    parser.add_argument(
        "--tickets", type=int, default=0, help="the first N tickets per round (default: all)"
    )
    parser.add_argument(
        "--llama-args",
        default="",
        help="more llama-server flags for every target (after make run's: a later flag "
        "wins), e.g. '-c 8192' for a slow model's servers to fit in memory side by side",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="seconds each decision asks for (X-Semif-Deadline; 0: the proxy's 50 s). On a slow "
        "model 8 tickets at once take longer than 80%% of 50 s, and admission refuses the "
        "last ones (429), where llama-server alone queues them: a batch caller's deadline",
    )
    args = parser.parse_args()
    if args.segment and args.stock:
        parser.error("--stock adds a target at -ub 512, which --segment gives every target")
    numbers = itertools.count(1000)
    with contextlib.ExitStack() as stack:

        def own_server(extra: list[str] | None = None) -> str:
            """A llama-server for one target alone, started as `make run` starts it
            (``extra`` appended to its flags: a later flag wins; ``--segment``: at -ub 512)."""
            flags = (STOCK if args.segment else []) + shlex.split(args.llama_args) + (extra or [])
            return stack.enter_context(llama_server_process(extra=flags))[0]

        llama_url = own_server()
        ubatch = None if args.segment else UBATCH
        proxy_url = stack.enter_context(proxy_process(llama_url, ubatch=ubatch))[0]
        if args.routing:
            tickets, ask = LONG_TICKETS, proxy_body(ROUTER, "options_first", INSTRUCTIONS)
            # the conventional layout: the instructions and options after the ticket
            labels = asyncio.run(labels_of(proxy_url, ask(1, tickets[0])))
            targets = {
                "proxy": (proxy_url + PATH, ask),
                "chat": (
                    own_server() + PATH,
                    chat_body(ROUTER, labels, "conversation_first", INSTRUCTIONS),
                ),
                "by-hand": (own_server() + PATH, by_hand_body(ROUTER, labels)),
            }
            if args.stock:
                targets["hand-512"] = (own_server(STOCK) + PATH, by_hand_body(ROUTER, labels))
        else:
            tickets, ask = TICKETS, proxy_body(OPTIONS)
            labels = asyncio.run(labels_of(proxy_url, ask(1, tickets[0])))
            targets = {
                "proxy": (proxy_url + PATH, ask),
                "chat": (own_server() + PATH, chat_body(OPTIONS, labels, "conversation_first")),
            }
            if args.stock:
                targets["chat-512"] = (
                    own_server(STOCK) + PATH,
                    chat_body(OPTIONS, labels, "conversation_first"),
                )
        one_url = own_server()
        targets["one-token"] = (one_url + "/completion", one_token_body(one_url))
        tickets = tickets[: args.tickets or None]
        results = {
            c: asyncio.run(measure(targets, tickets, args.rounds, c, numbers, args.deadline))
            for c in (1, 8)
        }
    print(describe())
    print(
        f"{args.rounds} rounds x {len(tickets)} new conversations per target"
        + (" (the routing workload)" if args.routing else "")
        + ("; every llama-server at -ub 512, the segment scheme" if args.segment else "")
    )
    report(results, _routing_budgets if args.routing else _fresh_budgets)


if __name__ == "__main__":
    main()
