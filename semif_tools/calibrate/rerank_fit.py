"""Calibrating rerank scores: ``python -m semif_tools calibrate`` on labelled rerank data.

One JSON line per query, the documents to rank and which of them are relevant::

    {"query": "How do I get a refund?", "documents": ["...", "..."], "relevant": [0, 3]}

Each line is read once through the proxy's ``/v1/rerank`` (pointwise, uncalibrated;
``read.read_rerank_scores``). The queries are split (seeded): a monotone map of the scores,
Platt's sigmoid(a * logit(p) + b) with a > 0, is fitted on the document pairs of the fit
queries and judged on the held-out queries only. An increasing map cannot change any
query's order, so ranking quality (NDCG@k, MRR) is the same before and after and is
reported once; what calibration changes is whether a score means a probability of
relevance (ECE of the pairs, before and after). The profile carries the map for the yes/no
(``noul``) questions the pointwise reranker asks; apply it with ``"x_calibration": NAME``
on ``/v1/rerank``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from proxy.calibration.transform import platt_scale

from .dataset import DataError, records
from .fit import fit_platt
from .scores import expected_calibration_error

__all__ = [
    "RerankItem",
    "is_rerank",
    "load_rerank_items",
    "ndcg_at",
    "reciprocal_rank",
    "chance_ndcg_at",
    "chance_reciprocal_rank",
    "split_queries",
    "RerankFit",
    "fit_rerank",
]


@dataclass(frozen=True)
class RerankItem:
    source: str  # "file:line"
    query: str
    documents: tuple[str, ...]
    relevant: frozenset[int]


def is_rerank(data: Any) -> bool:
    """Whether a parsed line is rerank data (not a System One request)."""
    return isinstance(data, dict) and "query" in data and "relevant" in data


def _item(data: Any, source: str) -> RerankItem:
    if not is_rerank(data):
        raise DataError(f"{source}: a rerank line has query, documents and relevant")
    query, documents, relevant = data["query"], data.get("documents"), data["relevant"]
    if not isinstance(query, str) or not query.strip():
        raise DataError(f"{source}: query must be a non-empty string")
    if not isinstance(documents, list) or len(documents) < 2:
        raise DataError(f"{source}: documents must be a list of at least two")
    texts = tuple(d.get("text") if isinstance(d, dict) else d for d in documents)
    if not all(isinstance(t, str) for t in texts):
        raise DataError(f"{source}: each document is a string or an object with text")
    if (
        not isinstance(relevant, list)
        or not relevant
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in relevant)
        or not all(0 <= i < len(texts) for i in relevant)
    ):
        raise DataError(f"{source}: relevant must list one or more document indices")
    return RerankItem(source, query, texts, frozenset(relevant))


def load_rerank_items(paths: Iterable[Path | str], limit: int | None = None) -> list[RerankItem]:
    items = [_item(data, source) for source, data in islice(records(paths), limit)]
    if not items:
        raise DataError("no rerank lines in the data")
    return items


def ranking(scores: Sequence[float]) -> list[int]:
    """Document indices best first, the caller's order among equal scores (as the API)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def ndcg_at(scores: Sequence[float], relevant: frozenset[int], k: int) -> float:
    """NDCG@k with binary gains: DCG = sum over the top k of rel_i / log2(i + 2) (i from 0),
    divided by the DCG of the ideal order (every relevant document first)."""
    order = ranking(scores)[:k]
    dcg = math.fsum(1 / math.log2(i + 2) for i, doc in enumerate(order) if doc in relevant)
    ideal = math.fsum(1 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return dcg / ideal


def reciprocal_rank(scores: Sequence[float], relevant: frozenset[int]) -> float:
    """1 / the rank (from 1) of the first relevant document."""
    return next(1 / (rank + 1) for rank, doc in enumerate(ranking(scores)) if doc in relevant)


def chance_ndcg_at(n: int, relevant: int, k: int) -> float:
    """The expected NDCG@k of a random order of ``n`` documents, ``relevant`` of them
    relevant: each position holds a relevant one with probability relevant / n."""
    expected = math.fsum(relevant / n / math.log2(i + 2) for i in range(min(k, n)))
    return expected / math.fsum(1 / math.log2(i + 2) for i in range(min(k, relevant)))


def chance_reciprocal_rank(n: int, relevant: int) -> float:
    """The expected 1 / rank of the first relevant document in a random order: the first
    is at rank j with probability C(n - j, relevant - 1) / C(n, relevant)."""
    total = math.comb(n, relevant)
    return math.fsum(math.comb(n - j, relevant - 1) / total / j for j in range(1, n - relevant + 2))


def split_queries(n: int, test_share: float, seed: int) -> list[bool]:
    """Which queries are held out (True): round(n * test_share) of them, at least one,
    drawn with ``seed``; the rest fit the map."""
    count = min(n - 1, max(1, round(n * test_share)))
    held = set(random.Random(seed).sample(range(n), count))
    return [i in held for i in range(n)]


@dataclass(frozen=True)
class RerankFit:
    a: float
    b: float
    method: str  # "platt", or "none" when no increasing map fits (a <= 0)
    n_fit_queries: int
    n_fit_pairs: int
    n_test_queries: int
    n_test_pairs: int
    k: int
    ndcg: float  # mean NDCG@k over the held-out queries
    mrr: float  # mean reciprocal rank over the held-out queries
    ndcg_chance: float  # the same for a random order of each query's documents
    mrr_chance: float
    ece_before: float  # of the held-out pairs' scores
    ece_after: float
    note: str = ""

    def params(self) -> dict[str, float]:
        return {"a": self.a, "b": self.b} if self.method == "platt" else {}


def _ece(scores: Sequence[float], relevant: Sequence[bool]) -> float:
    return expected_calibration_error(
        [(p, 1 - p) for p in scores], [0 if r else 1 for r in relevant]
    )


def fit_rerank(
    items: Sequence[RerankItem],
    scores: Sequence[Sequence[float]],
    *,
    test_share: float = 0.3,
    seed: int = 0,
    k: int = 3,
) -> RerankFit:
    """The map fitted on the fit queries' pairs, judged on the held-out queries."""
    if len(items) < 2:
        raise DataError("rerank calibration needs at least two queries (one is held out)")
    held = split_queries(len(items), test_share, seed)
    fit = [
        (p, j in it.relevant)
        for it, s, h in zip(items, scores, held)
        if not h
        for j, p in enumerate(s)
    ]
    test = [(it, s) for it, s, h in zip(items, scores, held) if h]
    a, b = fit_platt([p for p, _ in fit], [r for _, r in fit])
    method, note = "platt", ""
    if not a > 0:  # decreasing: it would reverse every ranking
        a, b, method = 1.0, 0.0, "none"
        note = "the fitted slope is not positive (the scores rank relevant documents lower)"
    pairs = [(p, j in it.relevant) for it, s in test for j, p in enumerate(s)]
    before = [p for p, _ in pairs]
    after = [platt_scale([p, 1 - p], a, b)[0] for p in before] if method == "platt" else before
    return RerankFit(
        a,
        b,
        method,
        len(items) - len(test),
        len(fit),
        len(test),
        len(pairs),
        k,
        ndcg=math.fsum(ndcg_at(s, it.relevant, k) for it, s in test) / len(test),
        mrr=math.fsum(reciprocal_rank(s, it.relevant) for it, s in test) / len(test),
        ndcg_chance=math.fsum(
            chance_ndcg_at(len(it.documents), len(it.relevant), k) for it, _ in test
        )
        / len(test),
        mrr_chance=math.fsum(
            chance_reciprocal_rank(len(it.documents), len(it.relevant)) for it, _ in test
        )
        / len(test),
        ece_before=_ece(before, [r for _, r in pairs]),
        ece_after=_ece(after, [r for _, r in pairs]),
        note=note,
    )
