"""What ranking costs per document: /v1/rerank pointwise (one yes/no read per document,
the query computed once) against listwise (one choice over all documents, one read), at
several document counts, each request on a query no earlier request sent.

    .venv/bin/python bench/rerank.py [--counts 5,20,50] [--repeats 3]

Starts llama-server and the proxy as `make run` does. Prints, per method and count, the
median latency of the request, the latency per document and the tokens llama-server
evaluated (the rest came from its cache), over ``--repeats`` requests.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import httpx
from _machine import describe
from _servers import llama_server, proxy

# short support answers, as a retrieval stage would hand over
ANSWERS = [
    "Refunds for duplicate charges are made from the Billing page within a week.",
    "Parcels leave the warehouse Monday to Friday and arrive in three to five days.",
    "Reset a forgotten password with the link on the sign-in page.",
    "Invoices are under Account, Orders; each one has a PDF download.",
    "Returns are free within thirty days; print the label from your order.",
    "Two-factor authentication is turned on under Settings, Security.",
    "A declined card is a decision of your bank: check its limit and 3-D Secure.",
    "Delivery addresses can be changed until the order ships.",
    "Subscriptions can be cancelled any time and stay active to the end of the period.",
    "Damaged items are replaced for free when you send a photo.",
]


def documents(n: int) -> list[str]:
    return [f"{ANSWERS[i % len(ANSWERS)]} (article {i + 1})" for i in range(n)]


def one(client: httpx.Client, url: str, n: int, method: str) -> tuple[float, int, int]:
    query = f"Ticket {uuid.uuid4().hex[:8]}: I was charged twice for my last order, help?"
    started = time.perf_counter()
    resp = client.post(
        url + "/v1/rerank", json={"query": query, "documents": documents(n), "x_method": method}
    )
    took = time.perf_counter() - started
    resp.raise_for_status()
    body = resp.json()
    return took, body["x_evaluated_tokens"], body["usage"]["prompt_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="5,20,50")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    rows = []
    with llama_server() as upstream, proxy(upstream) as url, httpx.Client(timeout=600) as client:
        one(client, url, 5, "pointwise")  # the label check and first reads: not measured
        for n in counts:
            for method in ("pointwise", "listwise"):
                runs = [one(client, url, n, method) for _ in range(args.repeats)]
                took = statistics.median(r[0] for r in runs)
                rows.append(
                    (
                        method,
                        n,
                        took,
                        statistics.median(r[1] for r in runs),
                        statistics.median(r[2] for r in runs),
                    )
                )
    print(describe())
    print(
        f"median of {args.repeats} requests per row, each on a new query "
        "(its tokens cold); tokens: evaluated by llama-server / in all prompts"
    )
    print(f"  {'method':10}{'docs':>6}{'request ms':>12}{'ms/doc':>9}{'tokens':>18}")
    for method, n, took, evaluated, prompt in rows:
        print(
            f"  {method:10}{n:6d}{took * 1e3:12.0f}{took * 1e3 / n:9.1f}"
            f"{f'{evaluated:.0f} / {prompt:.0f}':>18}"
        )


if __name__ == "__main__":
    main()
