"""Read the state once: 16 questions about one ~1,000-token state as one System One
request, against the same 16 questions sent as 16 separate single-question
requests (one after another, and all at once), interleaved in one run.

    .venv/bin/python bench/shared_state.py [--rounds 3] [--paragraphs 66] [--segment]

``--paragraphs`` sets the state's length (66: about 1,000 tokens; 105: about 1,600).
``--segment``: llama-server at its default physical batch (``-ub 512``) and the proxy
told nothing of it, so it reads by the segment scheme (docs/repeatability.md), the
configuration for traffic that is mostly long shared states; without it, as make run.

Every measurement uses a fresh state (a new ticket number at its start), so
no variant profits from a cache another one filled. Targets: the 16 requests sent
all at once are all answered (200) and take at most 1.3 times the single request.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import aiohttp
from _servers import STOCK, llama_server, proxy
from overhead import rotated

from scripts.stack import LLAMA_FLAGS, UBATCH

PARAGRAPHS = [
    "The customer explains that the order arrived in two parcels, one of them opened.",
    "They were charged twice on the same card, once at checkout and once on delivery.",
    "Customer support promised a call back on Monday but nobody called.",
    "The mobile app shows the order as delivered while the tracking page says in transit.",
    "A discount code from the newsletter was not applied to the second item.",
    "The invoice lists an express delivery fee although standard delivery was chosen.",
]
QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {
            "billing": "charges, refunds",
            "shipping": "parcels, delivery",
            "technical": "app and website",
            "other": None,
        },
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["can wait", "this week", "today", "right now"],
    },
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
    "tone": {
        "type": "choice",
        "instructions": "What is the tone?",
        "criteria": {"polite": None, "neutral": None, "rude": None},
    },
    "language": {
        "type": "choice",
        "instructions": "Which language is it written in?",
        "criteria": {"English": None, "French": None, "German": None, "Spanish": None},
    },
    "double_charge": {"type": "noul", "instructions": "Was the customer charged twice?"},
    "damaged": {"type": "noul", "instructions": "Did something arrive damaged?"},
    "app_bug": {"type": "noul", "instructions": "Does it report a problem with the app?"},
    "churn": {
        "type": "score",
        "instructions": "How likely is the customer to leave?",
        "criteria": ["unlikely", "possible", "likely"],
    },
    "followup": {"type": "noul", "instructions": "Was a follow-up promised and missed?"},
    "discount": {"type": "noul", "instructions": "Is a discount code mentioned?"},
    "channel": {
        "type": "choice",
        "instructions": "How should we reply?",
        "criteria": {"email": None, "phone": None, "chat": None},
    },
    "priority": {
        "type": "score",
        "instructions": "What priority should the ticket get?",
        "criteria": ["P3", "P2", "P1", "P0"],
    },
    "vip": {"type": "noul", "instructions": "Does the customer mention being a long-time client?"},
    "summary_ok": {"type": "noul", "instructions": "Is the ticket about more than one problem?"},
}


PARAGRAPHS_IN_STATE = [66]  # --paragraphs


def fresh_state() -> str:
    rng = random.Random()
    body = " ".join(rng.choice(PARAGRAPHS) for _ in range(PARAGRAPHS_IN_STATE[0]))
    return f"Ticket #{rng.randrange(10**9)}\n\n{body}"


async def one_request(session, url, state) -> float:
    t0 = time.perf_counter()
    async with session.post(url, json={"state": state, "questions": QUESTIONS}) as r:
        assert r.status == 200, await r.text()
        await r.read()
    return time.perf_counter() - t0


STATUSES: dict[str, list[int]] = {
    "16 requests, one after another": [],
    "16 requests, all at once": [],
}


async def separate(session, url, state, concurrent: bool) -> float:
    statuses = STATUSES[
        "16 requests, all at once" if concurrent else "16 requests, one after another"
    ]

    async def ask(qid):
        async with session.post(
            url, json={"state": state, "questions": {qid: QUESTIONS[qid]}}
        ) as r:
            await r.read()
            statuses.append(r.status)  # the target: every one of them a 200

    t0 = time.perf_counter()
    if concurrent:
        await asyncio.gather(*(ask(qid) for qid in QUESTIONS))
    else:
        for qid in QUESTIONS:
            await ask(qid)
    return time.perf_counter() - t0


async def measure(proxy_url: str, fanout_url: str, rounds: int) -> dict[str, list[float]]:
    url = proxy_url + "/v1/systemone"
    variants = {
        "one request, 16 questions": lambda s, st: one_request(s, url, st),
        "one request, fan-out to slots": lambda s, st: one_request(
            s, fanout_url + "/v1/systemone", st
        ),
        "16 requests, one after another": lambda s, st: separate(s, url, st, False),
        "16 requests, all at once": lambda s, st: separate(s, url, st, True),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await one_request(session, url, fresh_state())  # warm-up: labels, connections
        for i in range(rounds):
            for name in rotated(list(variants), i):
                times[name].append(await variants[name](session, fresh_state()))
    return times


async def state_tokens(llama_url: str) -> int:
    async with (
        aiohttp.ClientSession() as s,
        s.post(llama_url + "/tokenize", json={"content": fresh_state()}) as r,
    ):
        return len((await r.json())["tokens"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paragraphs", type=int, default=66, help="the state's length")
    parser.add_argument(
        "--segment", action="store_true", help="llama-server's default -ub, the segment scheme"
    )
    args = parser.parse_args()
    PARAGRAPHS_IN_STATE[0] = args.paragraphs
    llama_args, ubatch = (STOCK, None) if args.segment else ([], UBATCH)
    with (
        llama_server(extra=llama_args) as llama_url,
        proxy(llama_url, ubatch=ubatch) as proxy_url,
        proxy(llama_url, ["--question-fanout", "0"], ubatch=ubatch) as fanout_url,
    ):
        n_tokens = asyncio.run(state_tokens(llama_url))
        times = asyncio.run(measure(proxy_url, fanout_url, args.rounds))
    print(
        f"state of {n_tokens} tokens, {len(QUESTIONS)} questions, {args.rounds} rounds (median s);"
        f" llama-server {' '.join([*LLAMA_FLAGS, *llama_args])};"
        f" read scheme {'segment' if args.segment else 'prefix-63'}"
    )
    medians = {name: statistics.median(v) for name, v in times.items()}
    single = medians["one request, 16 questions"]
    for name, med in medians.items():
        print(f"  {name:32} {med:7.2f} s   single / this = {single / med:5.2f}")
    for name, statuses in STATUSES.items():
        answered = statuses.count(200)
        counts = ", ".join(f"{code}: {statuses.count(code)}" for code in sorted(set(statuses)))
        print(f"  {name}: {answered} of {len(statuses)} answered with 200 (target: all); {counts}")
    at_once = medians["16 requests, all at once"] / single
    print(
        f"  16 requests at once / one request = {at_once:.2f}"
        f" (target: at most 1.3): {'holds' if at_once <= 1.3 else 'missed'}"
    )


if __name__ == "__main__":
    main()
