"""The chat.completion a decision answers: the distribution in choices[0].logprobs too."""

import math

import pytest

from proxy.decision.outcome import Outcome
from proxy.decision.question import choice_question, noul_question
from proxy.decision.readout import decide
from proxy.errors import InvalidRequest
from proxy.protocol.chat import LEAST_LOGPROB, completion_body, completion_chunks
from proxy.protocol.semif import parse_chat

ln = math.log


def _outcome(names, probs, **extra):
    logprobs = [ln(p) if p > 0 else -800.0 for p in probs]  # exp(-800) is 0 in a float
    return Outcome(
        decide(choice_question(names), logprobs), ("A",) * len(names), "m", 12, 12, 1, **extra
    )


def test_logprobs_list_the_chosen_option_and_the_most_likely_ones():
    out = _outcome(["billing", "shipping", "technical"], [0.2, 0.5, 0.3])
    body = completion_body(out, None, 2)
    (position,) = body["choices"][0]["logprobs"]["content"]
    assert position["token"] == "shipping" == body["choices"][0]["message"]["content"]
    assert position["logprob"] == pytest.approx(ln(0.5), rel=1e-12)
    assert position["bytes"] == list(b"shipping")
    assert [(e["token"], e["logprob"]) for e in position["top_logprobs"]] == [
        ("shipping", pytest.approx(ln(0.5), rel=1e-12)),
        ("technical", pytest.approx(ln(0.3), rel=1e-12)),
    ]
    assert body["choices"][0]["logprobs"]["refusal"] is None
    assert body["semif"]["logprobs_of"] == "read"


def test_ties_keep_the_option_order_and_zero_is_openais_stand_in():
    out = _outcome(["a", "b", "c"], [0.5, 0.5, 0.0])
    entries = completion_body(out, None, 20)["choices"][0]["logprobs"]["content"][0]
    assert [e["token"] for e in entries["top_logprobs"]] == ["a", "b", "c"]
    assert entries["top_logprobs"][2]["logprob"] == LEAST_LOGPROB


def test_no_logprobs_unless_asked_and_calibrated_ones_say_so():
    out = _outcome(["a", "b"], [0.4, 0.6], calibration={"profile": "p", "method": "temperature"})
    plain = completion_body(out, None)
    assert plain["choices"][0]["logprobs"] is None and "logprobs_of" not in plain["semif"]
    assert completion_body(out, None, 0)["semif"]["logprobs_of"] == "calibrated"
    assert (
        completion_body(out, None, 0)["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    )


def test_a_noul_answer_lists_true_and_false():
    q = noul_question(None, loc=())
    out = Outcome(decide(q, [ln(0.7), ln(0.3)]), ("A", "B"), "m", 5, 5, 1)
    position = completion_body(out, None, 5)["choices"][0]["logprobs"]["content"][0]
    assert position["token"] == "true"
    assert [e["token"] for e in position["top_logprobs"]] == ["true", "false"]


def _parsed(body):
    return parse_chat(
        {"messages": [{"role": "user", "content": "hi"}], "semif": {"type": "noul"}, **body}
    )


@pytest.mark.parametrize(
    ("body", "top"),
    [
        ({}, None),
        ({"logprobs": False}, None),
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 20}, 20),
    ],
)
def test_requested_logprobs(body, top):
    assert _parsed(body).top_logprobs == top


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"logprobs": "yes"}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
    ],
)
def test_bad_logprobs_requests_are_refused(body, param):
    with pytest.raises(InvalidRequest) as err:
        _parsed(body)
    assert err.value.param == param


def test_a_stream_sends_usage_only_when_asked():
    out = _outcome(["a", "b"], [0.4, 0.6])
    (only,) = completion_chunks(out, None)
    assert "usage" not in only and only["object"] == "chat.completion.chunk"
    answer, closing = completion_chunks(out, None, 1, include_usage=True)
    assert answer["usage"] is None and answer["choices"][0]["logprobs"] is not None
    assert closing["choices"] == [] and closing["usage"]["prompt_tokens"] == 12
    assert answer["id"] == closing["id"] and "semif" not in closing
