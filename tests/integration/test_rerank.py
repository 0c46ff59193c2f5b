"""/v1/rerank on the real llama-server (a chat model): the shape rerank clients speak
(Cohere's SDK, and httpx against the documented shape), pointwise and listwise, bad input,
the query read once, and a calibration profile fitted on rerank data applied."""

from __future__ import annotations

import math
import uuid

import cohere
import httpx
import pytest

DOCS = [
    "You can request a refund for duplicate charges from the Billing page.",
    "Our warehouse ships orders Monday to Friday.",
    "To reset your password, click 'Forgot password'.",
    "If you were charged twice, contact billing and we reverse the charge.",
]
QUERY = "How do I get a refund for a double charge?"


def rerank(proxy_url: str, path: str = "/v1/rerank", **body):
    return httpx.post(
        proxy_url + path, json={"query": QUERY, "documents": DOCS, **body}, timeout=300
    )


def test_results_are_sorted_with_the_original_indices(proxy_url):
    resp = rerank(proxy_url, top_n=3, return_documents=True)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 3
    assert all(0 <= s <= 1 for s in scores)
    assert all(r["document"]["text"] == DOCS[r["index"]] for r in body["results"])
    assert body["object"] == "list" and body["x_method"] == "pointwise"
    # the same request, the same scores (repeatable reads)
    again = rerank(proxy_url, top_n=3).json()["results"]
    assert [(r["index"], r["relevance_score"]) for r in again] == [
        (r["index"], r["relevance_score"]) for r in body["results"]
    ]


@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/reranking"])
def test_llama_servers_other_paths_answer_the_same(proxy_url, path):
    def scored(results: list[dict]) -> list[dict]:  # each answer has its own decision id
        return [{k: v for k, v in r.items() if k != "x_decision_id"} for r in results]

    first = rerank(proxy_url).json()["results"]
    assert scored(rerank(proxy_url, path).json()["results"]) == scored(first)


def test_cohere_clients_parse_the_answer(proxy_url):
    with httpx.Client(timeout=300) as http:  # closed here, not left to the collector
        v2 = cohere.ClientV2(api_key="unused", base_url=proxy_url, httpx_client=http)
        ranked = v2.rerank(model="jev-latest", query=QUERY, documents=DOCS, top_n=2)
        v1 = cohere.Client(api_key="unused", base_url=proxy_url, httpx_client=http)
        all_four = v1.rerank(query=QUERY, documents=DOCS, top_n=4)
    assert len(ranked.results) == 2
    assert ranked.results[0].relevance_score >= ranked.results[1].relevance_score
    direct = rerank(proxy_url, top_n=2).json()["results"]
    assert [(r.index, r.relevance_score) for r in ranked.results] == [
        (r["index"], r["relevance_score"]) for r in direct
    ]
    assert len(all_four.results) == 4


def test_listwise_scores_sum_to_one(proxy_url):
    body = rerank(proxy_url, x_method="listwise").json()
    scores = [r["relevance_score"] for r in body["results"]]
    assert body["x_method"] == "listwise" and len(scores) == len(DOCS)
    assert math.fsum(scores) == pytest.approx(1.0, abs=1e-12)
    assert sorted(r["index"] for r in body["results"]) == list(range(len(DOCS)))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": "", "documents": DOCS}, "query"),
        ({"query": QUERY, "documents": []}, "documents"),
        ({"query": QUERY, "documents": ["a", 1]}, "documents.1"),
        ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
        ({"query": QUERY, "documents": DOCS, "x_method": "pairwise"}, "x_method"),
        ({"query": QUERY, "documents": ["x"] * 257}, "documents"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(proxy_url, body, param):
    resp = httpx.post(proxy_url + "/v1/rerank", json=body, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param


def test_a_listwise_request_over_the_context_says_what_it_needed(proxy_url):
    long = ["word " * 1500] * 8  # ~12,000 tokens; a slot holds 8192 (-c 32768 -np 4)
    resp = httpx.post(
        proxy_url + "/v1/rerank",
        timeout=120,
        json={"query": "q", "documents": long, "x_method": "listwise"},
    )
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "a llama-server slot holds 8192" in error["message"]


def test_twenty_documents_evaluate_the_query_once(proxy_url):
    # a query no earlier request sent, long enough to see: its tokens are computed once
    query = f"Case {uuid.uuid4().hex}: " + "my order was charged twice and never shipped. " * 12
    docs = [f"Answer {i}: contact billing about double charges." for i in range(20)]
    body = httpx.post(
        proxy_url + "/v1/rerank", json={"query": query, "documents": docs}, timeout=300
    ).json()
    query_tokens = len(
        httpx.post(proxy_url + "/tokenize", json={"content": query}).json()["tokens"]
    )
    prompt, evaluated = body["usage"]["prompt_tokens"], body["x_evaluated_tokens"]
    # every document's prompt holds the query; llama-server computed it for the first only
    assert evaluated <= prompt - 19 * query_tokens
    assert evaluated >= query_tokens


def test_a_profile_fitted_on_rerank_data_keeps_the_order_and_changes_the_scores(
    llama, logs_dir, tmp_path
):
    import json
    from pathlib import Path

    from scripts.stack import stop
    from semif_tools.calibrate.cli import main
    from tests.conftest import launch_proxy

    proc, url, log = launch_proxy(logs_dir, llama.url, "--calibration-dir", str(tmp_path))
    try:
        data = Path(__file__).parents[1] / "data" / "rerank" / "support.jsonl"
        assert (
            main(
                [
                    str(data),
                    "--profile",
                    "rr",
                    "--url",
                    url,
                    "--out-dir",
                    str(tmp_path),
                    "--limit",
                    "10",
                ]
            )
            == 0
        )
        profile = json.loads((tmp_path / "rr.json").read_text())
        figures = profile["metrics"]["rerank"]
        assert (figures["n_fit_queries"], figures["n_test_queries"]) == (7, 3)
        assert 0 <= figures["ndcg"] <= 1 and 0 < figures["mrr"] <= 1
        raw = rerank(url).json()
        calibrated = rerank(url, x_calibration="rr").json()
    finally:
        stop(proc)
        log.close()
    assert calibrated["x_calibration"]["profile"] == "rr"
    # an increasing map: the same order, other scores (unless no map was kept)
    assert [r["index"] for r in calibrated["results"]] == [r["index"] for r in raw["results"]]
    if profile["calibration"]["noul"]["method"] == "platt":
        assert calibrated["results"][0]["relevance_score"] != raw["results"][0]["relevance_score"]
