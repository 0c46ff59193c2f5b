"""Rerank calibration (semif_tools/calibrate/rerank_fit.py): the ranking metrics with exact
values, the query split, and a fit that keeps every order and says what it did."""

from __future__ import annotations

import json
import math

import pytest

from semif_tools.calibrate.dataset import DataError
from semif_tools.calibrate.rerank_fit import (
    RerankItem,
    fit_rerank,
    load_rerank_items,
    ndcg_at,
    ranking,
    reciprocal_rank,
    split_queries,
)


def test_ndcg_with_binary_gains():
    # ranked: doc 2 (relevant), doc 0, doc 1 (relevant)
    scores, relevant = [0.5, 0.1, 0.9], frozenset({1, 2})
    assert ranking(scores) == [2, 0, 1]
    dcg = 1 / math.log2(2) + 1 / math.log2(4)
    ideal = 1 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at(scores, relevant, 3) == pytest.approx(dcg / ideal, rel=1e-15)
    assert ndcg_at(scores, relevant, 1) == 1.0
    assert ndcg_at(scores, frozenset({1}), 2) == 0.0  # not in the top 2
    assert ndcg_at([0.3, 0.3, 0.1], frozenset({1}), 2) == pytest.approx(1 / math.log2(3))


def test_reciprocal_rank_and_ties_in_the_callers_order():
    assert reciprocal_rank([0.2, 0.9, 0.4], frozenset({0})) == pytest.approx(1 / 3)
    assert reciprocal_rank([0.5, 0.5], frozenset({1})) == 0.5  # the tie keeps index order
    assert reciprocal_rank([0.5, 0.5], frozenset({0})) == 1.0


def test_the_split_holds_out_a_seeded_share_of_queries():
    held = split_queries(24, 0.3, seed=0)
    assert sum(held) == 7 and held == split_queries(24, 0.3, seed=0)
    assert held != split_queries(24, 0.3, seed=1)
    assert sum(split_queries(2, 0.9, 0)) == 1 and sum(split_queries(3, 0.01, 0)) == 1


def items_and_scores(n: int, relevant_score: float, other_score: float):
    items = [RerankItem(f"x:{i}", f"q{i}", ("a", "b", "c"), frozenset({i % 3})) for i in range(n)]
    scores = [[relevant_score if j == i % 3 else other_score for j in range(3)] for i in range(n)]
    return items, scores


def test_an_overconfident_scorer_gets_an_increasing_map_that_lowers_the_ece():
    items, scores = items_and_scores(20, 0.9, 0.8)  # every score high, a third relevant
    fit = fit_rerank(items, scores, test_share=0.3, seed=0, k=1)
    assert fit.method == "platt" and fit.a > 0
    assert (fit.n_test_queries, fit.n_test_pairs, fit.n_fit_pairs) == (6, 18, 42)
    assert fit.ndcg == 1.0 and fit.mrr == 1.0  # the relevant document always first
    assert fit.ece_after < fit.ece_before


def test_scores_that_rank_relevant_documents_last_keep_no_map():
    items, scores = items_and_scores(10, 0.1, 0.9)
    fit = fit_rerank(items, scores, seed=0)
    assert fit.method == "none" and fit.params() == {} and "not positive" in fit.note
    assert fit.ece_after == fit.ece_before
    assert fit.mrr == pytest.approx(1 / 3)


def test_bad_rerank_lines_name_the_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    good = {"query": "q", "documents": ["a", {"text": "b"}], "relevant": [1]}
    path.write_text(
        json.dumps(good) + "\n# a comment\n" + json.dumps({**good, "relevant": [2]}) + "\n"
    )
    with pytest.raises(DataError, match=r"r.jsonl:3: relevant"):
        load_rerank_items([path])
    assert load_rerank_items([path], limit=1)[0].documents == ("a", "b")


def test_the_shipped_rerank_set_parses():
    from pathlib import Path

    items = load_rerank_items([Path(__file__).parents[1] / "data" / "rerank" / "support.jsonl"])
    assert len(items) == 24 and sum(len(i.documents) for i in items) == 120
    assert all(1 <= len(i.relevant) <= 2 for i in items)


def test_chance_figures_are_the_means_over_every_order():
    from itertools import permutations

    from semif_tools.calibrate.rerank_fit import chance_ndcg_at, chance_reciprocal_rank

    n, relevant = 5, frozenset({0, 3})
    orders = list(permutations(range(n)))
    # a score per document from each order: the first position gets the highest score
    scored = [[n - order.index(d) for d in range(n)] for order in orders]
    mean_rr = math.fsum(reciprocal_rank(s, relevant) for s in scored) / len(orders)
    mean_ndcg = math.fsum(ndcg_at(s, relevant, 3) for s in scored) / len(orders)
    assert chance_reciprocal_rank(n, 2) == pytest.approx(mean_rr, rel=1e-12)
    assert chance_ndcg_at(n, 2, 3) == pytest.approx(mean_ndcg, rel=1e-12)
    assert chance_reciprocal_rank(4, 4) == 1.0
