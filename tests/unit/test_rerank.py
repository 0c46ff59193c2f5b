"""The rerank wire format (proxy/protocol/rerank.py): what is refused and which field it
names, the questions each method asks, and the ranked answer, with exact values."""

from __future__ import annotations

import math

import pytest

from proxy.decision.outcome import Outcome
from proxy.decision.prompt import options_block
from proxy.decision.readout import decide
from proxy.errors import InvalidRequest
from proxy.protocol.rerank import (
    listwise_question,
    parse_request,
    pointwise_questions,
    query_state,
    relevance,
    response_body,
)

LIMITS = {"max_documents": 4, "max_document_chars": 50}
BODY = {"query": "refund for a double charge", "documents": ["charged twice", {"text": "late"}]}


def parse(**changes):
    return parse_request({**BODY, **changes}, **LIMITS)


@pytest.mark.parametrize(
    ("changes", "param", "code"),
    [
        ({"query": ""}, "query", None),
        ({"query": 3}, "query", None),
        ({"query": "q" * 51}, "query", "query_too_long"),
        ({"documents": []}, "documents", None),
        ({"documents": "one"}, "documents", None),
        ({"documents": ["a"] * 5}, "documents", "too_many_documents"),
        ({"documents": ["a", 7]}, "documents.1", None),
        ({"documents": ["a", {"txt": "b"}]}, "documents.1.text", None),
        ({"documents": ["a", "b" * 51]}, "documents.1", "document_too_long"),
        ({"top_n": 0}, "top_n", None),
        ({"top_n": True}, "top_n", None),
        ({"top_n": "2"}, "top_n", None),
        ({"return_documents": "yes"}, "return_documents", None),
        ({"x_method": "pairwise"}, "x_method", None),
        ({"x_method": "listwise", "documents": ["only one"]}, "documents", None),
        ({"x_method": "listwise", "x_calibration": "p"}, "x_calibration", None),
        ({"model": 4}, "model", None),
    ],
)
def test_bad_input_names_the_field(changes, param, code):
    with pytest.raises(InvalidRequest) as err:
        parse(**changes)
    assert err.value.param == param and err.value.status == 400
    if code:
        assert err.value.code == code


def test_listwise_takes_at_most_255_documents():
    with pytest.raises(InvalidRequest, match="at most 255"):
        parse_request(
            {**BODY, "x_method": "listwise", "documents": ["d"] * 256},
            max_documents=1000,
            max_document_chars=50,
        )


def test_documents_as_strings_or_objects_and_the_defaults():
    call = parse()
    assert call.documents == ("charged twice", "late")
    assert (call.top_n, call.return_documents, call.method, call.model) == (
        2,
        False,
        "pointwise",
        None,
    )
    assert parse(top_n=9).top_n == 2 and parse(top_n=None).top_n == 2


def test_pointwise_asks_one_yes_no_question_per_document_after_the_query():
    call = parse()
    assert query_state(call) == "Query:\nrefund for a double charge"
    questions = pointwise_questions(call)
    assert list(questions) == ["0", "1"]
    assert options_block(questions["1"], ("A", "B")) == (
        "Document:\nlate\n\nDoes this document answer or match the query?\n\n"
        "Options:\nA: yes\nB: no\n\nAnswer with the label of the best option only."
    )


def test_listwise_asks_one_choice_over_the_documents_in_order():
    question = listwise_question(parse(x_method="listwise"))
    assert question.names == ("Document 1", "Document 2")
    assert question.shown == ("Document 1 - charged twice", "Document 2 - late")


def outcome(question, logprobs, prompt, evaluated):
    return Outcome(decide(question, logprobs), ("A", "B"), "m", prompt, evaluated, 1)


def test_pointwise_scores_are_p_yes_and_the_answer_is_ranked_best_first():
    call = parse(return_documents=True, top_n=1)
    qs = pointwise_questions(call)
    # P(yes) = 0.2 for document 0, 0.75 for document 1 (normalised over yes/no)
    outcomes = {
        "0": outcome(qs["0"], [math.log(0.1), math.log(0.4)], 40, 40),
        "1": outcome(qs["1"], [math.log(0.6), math.log(0.2)], 38, 12),
    }
    scores = relevance(call, outcomes)
    assert scores == pytest.approx([0.2, 0.75], rel=1e-12)
    body = response_body(call, scores, outcomes, "m")
    assert body["results"] == [
        {"index": 1, "relevance_score": scores[1], "document": {"text": "late"}}
    ]
    assert body["usage"] == {"prompt_tokens": 78, "total_tokens": 78}
    assert body["x_evaluated_tokens"] == 52 and body["x_method"] == "pointwise"
    assert (body["object"], body["model"]) == ("list", "m")


def test_listwise_scores_sum_to_one_and_ties_keep_the_callers_order():
    call = parse(x_method="listwise", documents=["a", "b", "c"])
    q = listwise_question(call)
    outcomes = {
        "0": Outcome(
            decide(q, [math.log(0.25), math.log(0.5), math.log(0.25)]),
            ("A", "B", "C"),
            "m",
            60,
            60,
            1,
        )
    }
    scores = relevance(call, outcomes)
    assert scores == pytest.approx([0.25, 0.5, 0.25], rel=1e-12) and math.fsum(scores) == 1.0
    body = response_body(call, scores, outcomes, "m")
    assert [r["index"] for r in body["results"]] == [1, 0, 2]
    assert "document" not in body["results"][0]
