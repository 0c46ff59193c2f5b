"""The OpenAI Decisions API shape: parsing, validation and the response body."""

import re

import pytest
from openai.types import Decision as SdkDecision
from openai.types.decision import (
    AnswerAnswerResourceChoice,
    AnswerAnswerResourceChoiceProbability,
    AnswerAnswerResourcePredicate,
    AnswerAnswerResourceScore,
    AnswerAnswerResourceScoreProbability,
    Usage,
)

from proxy.decision.question import Question
from proxy.decision.readout import Decision
from proxy.errors import InvalidRequest
from proxy.protocol.decisions import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_JSON_VALUES,
    MAX_QUESTIONS,
    parse_request,
    response_body,
)
from proxy.service import Outcome

PREDICATE = {"type": "predicate", "instructions": "The customer asks for a refund."}
CHOICE = {"type": "choice", "instructions": "Team?", "choices": [{"value": "a"}, {"value": "b"}]}
SCORE = {
    "type": "score",
    "instructions": "Urgency?",
    "levels": [{"label": "low"}, {"label": "high"}],
}


def _body(input="Ticket", questions=(PREDICATE,), **extra):
    return {"model": "m", "input": input, "questions": list(questions), **extra}


def _nested(depth):
    data = {}
    for _ in range(depth - 1):
        data = {"k": data}
    return data


def _json_input(data):
    return [{"role": "user", "content": [{"type": "input_json", "data": data}]}]


@pytest.mark.parametrize(
    ("input", "text"),
    [
        ("Ticket: charged twice", "Ticket: charged twice"),
        ("", ""),
        ([{"role": "user", "content": "hi"}], "user: hi"),
        (
            [
                {
                    "type": "message",
                    "role": "system",
                    "content": [
                        {
                            "type": "input_text",
                            "text": "be brief",
                            "prompt_cache_breakpoint": {"mode": "explicit"},
                        }
                    ],
                },
                {"role": "developer", "content": "route tickets"},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "a\nb"},
                        {"type": "input_json", "data": {"order": 1182, "items": ["x"]}},
                    ],
                },
                {
                    "role": "assistant",
                    "phase": "final_answer",
                    "content": [
                        {"type": "output_text", "text": "ok"},
                        {"type": "refusal", "refusal": "no"},
                    ],
                },
            ],
            "system: be brief\ndeveloper: route tickets\n"
            'user: a\nb\n{"order": 1182, "items": ["x"]}\n'
            "assistant: ok\n(refused) no",
        ),
        (
            [
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "refund",
                    "arguments": '{"order": 1}',
                    "namespace": "billing",
                    "status": "completed",
                    "id": "fc_1",
                },
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [
                        {"type": "input_text", "text": "done"},
                        {"type": "input_text", "text": "id 7"},
                    ],
                },
                {"type": "custom_tool_call", "call_id": "c2", "name": "shell", "input": "ls"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": "a.txt"},
            ],
            'function_call billing.refund (c1): {"order": 1}\n'
            "function_call_output (c1): done\nid 7\n"
            "custom_tool_call shell (c2): ls\ncustom_tool_call_output (c2): a.txt",
        ),
        (_json_input([{"a": 1}, {"b": None}]), 'user: [{"a": 1}, {"b": null}]'),
    ],
)
def test_input_becomes_one_state_text(input, text):
    assert parse_request(_body(input)).state_text == text


@pytest.mark.parametrize(
    ("question", "expected", "values"),
    [
        (
            PREDICATE,
            Question("noul", ("true", "false"), ("yes", "no"), "The customer asks for a refund."),
            (),
        ),
        (
            {
                "type": "predicate",
                "name": "refund",
                "instructions": [
                    {"type": "input_text", "text": "Refund asked?"},
                    {"type": "input_json", "data": {"id": 3}},
                ],
            },
            Question("noul", ("true", "false"), ("yes", "no"), 'Refund asked?\n{"id": 3}'),
            (),
        ),
        (
            {
                "type": "choice",
                "instructions": "Pick",
                "choices": [
                    {"value": True, "description": "it is"},
                    {"value": False},
                    {"value": "maybe", "description": " "},
                ],
            },
            Question(
                "choice", ("true", "false", "maybe"), ("true - it is", "false", "maybe"), "Pick"
            ),
            (True, False, "maybe"),
        ),
        (
            {
                "type": "score",
                "instructions": "How urgent?",
                "levels": [
                    {"label": "low"},
                    {"label": "mid", "description": "this week "},
                    {"label": "high"},
                ],
            },
            Question(
                "score",
                ("0", "1", "2"),
                ("low", "mid - this week", "high"),
                "How urgent?",
                legend=("low", "mid - this week", "high"),
            ),
            ("low", "mid", "high"),
        ),
    ],
)
def test_questions_map_to_the_shared_builders(question, expected, values):
    asked = parse_request(_body(questions=[question])).asked[0]
    assert (asked.question, asked.values, asked.name) == (expected, values, question.get("name"))


def test_questions_keep_their_order_and_positions():
    call = parse_request(_body(questions=[SCORE, PREDICATE, CHOICE]))
    assert list(call.questions) == ["0", "1", "2"]
    assert [q.kind for q in call.questions.values()] == ["score", "noul", "choice"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "questions": [PREDICATE]}, "model"),
        (_body(model=3), "model"),
        ({"model": "m", "questions": [PREDICATE]}, "input"),
        (_body(5), "input"),
        (_body([]), "input"),
        (_body([5]), "input.0"),
        (_body([{"role": "tool", "content": "x"}]), "input.0"),
        (_body([{"role": "user", "content": 5}]), "input.0.content"),
        (_body([{"role": "user", "content": "x", "extra": 1}]), "input.0.extra"),
        (
            _body(
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_image", "image_url": "data:,"},
                        ],
                    }
                ]
            ),
            "input.0.content.1",
        ),
        (
            _body([{"role": "system", "content": [{"type": "input_image", "image_url": "u"}]}]),
            "input.0.content.0.type",
        ),
        (
            _body([{"role": "assistant", "content": [{"type": "refusal", "refusal": 5}]}]),
            "input.0.content.0.refusal",
        ),
        (
            _body([{"role": "user", "content": [{"type": "input_json", "data": 5}]}]),
            "input.0.content.0.data",
        ),
        (
            _body([{"type": "function_call_output", "call_id": "c1", "output": "x"}]),
            "input.0.call_id",
        ),
        (
            _body(
                [
                    {"type": "custom_tool_call", "call_id": "c1", "name": "t", "input": "i"},
                    {"type": "function_call_output", "call_id": "c1", "output": "x"},
                ]
            ),
            "input.1.call_id",
        ),
        (
            _body(
                [
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {
                        "type": "function_call_output",
                        "call_id": "c1",
                        "output": [{"type": "input_image", "image_url": "u"}],
                    },
                ]
            ),
            "input.1.output.0",
        ),
        (_body([{"type": "function_call", "call_id": "c1", "name": "f"}]), "input.0.arguments"),
        (_body(_json_input(_nested(MAX_JSON_DEPTH + 1))), "input.0.content.0.data"),
        (_body(_json_input({"v": list(range(MAX_JSON_VALUES - 1))})), "input.0.content.0.data"),
        (_body(_json_input({"v": "x" * MAX_JSON_BYTES})), "input.0.content.0.data"),
        (_body(questions=[]), "questions"),
        (_body(questions=[PREDICATE] * (MAX_QUESTIONS + 1)), "questions"),
        ({"model": "m", "input": "x"}, "questions"),
        (_body(questions=[{"type": "box", "instructions": "x"}]), "questions.0"),
        (_body(questions=[{"instructions": "x"}]), "questions.0"),
        (_body(questions=[{"type": "predicate"}]), "questions.0.instructions"),
        (
            _body(questions=[{"type": "predicate", "instructions": " \n"}]),
            "questions.0.instructions",
        ),
        (_body(questions=[{**PREDICATE, "criteria": {}}]), "questions.0.criteria"),
        (
            _body(
                questions=[
                    {
                        **PREDICATE,
                        "instructions": [
                            {"type": "input_text", "text": "a"},
                            {"type": "input_image", "image_url": "u"},
                        ],
                    }
                ]
            ),
            "questions.0.instructions.1",
        ),
        (
            _body(questions=[PREDICATE, {**CHOICE, "choices": [{"value": "a"}]}]),
            "questions.1.choices",
        ),
        (
            _body(questions=[{**CHOICE, "choices": [{"value": f"o{i}"} for i in range(256)]}]),
            "questions.0.choices",
        ),
        (
            _body(questions=[{**CHOICE, "choices": [{"value": "a"}, {"value": 1}]}]),
            "questions.0.choices.1.value",
        ),
        (
            _body(questions=[{**CHOICE, "choices": [{"value": "a"}, {"value": " "}]}]),
            "questions.0.choices.1.value",
        ),
        (
            _body(questions=[{**CHOICE, "choices": [{"value": "a"}, {"value": "a"}]}]),
            "questions.0.choices",
        ),
        (
            _body(questions=[{**CHOICE, "choices": [{"value": "true"}, {"value": True}]}]),
            "questions.0.choices",
        ),
        (
            _body(questions=[{**CHOICE, "choices": [{"value": "Billing"}, {"value": "billing "}]}]),
            "questions.0.choices",
        ),
        (
            _body(questions=[CHOICE, PREDICATE, {**SCORE, "levels": [{"label": "one"}]}]),
            "questions.2.levels",
        ),
        (
            _body(questions=[{**SCORE, "levels": [{"label": str(i)} for i in range(11)]}]),
            "questions.0.levels",
        ),
        (
            _body(questions=[{**SCORE, "levels": [{"label": "a"}, {"label": " "}]}]),
            "questions.0.levels.1.label",
        ),
        (
            _body(questions=[{**SCORE, "levels": [{"description": "d"}, {"label": "b"}]}]),
            "questions.0.levels.0.label",
        ),
        (_body(prompt_cache_options={"ttl": "1h"}), "prompt_cache_options.ttl"),
        (_body(temperature=0.5), "temperature"),
    ],
)
def test_invalid_requests_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as caught:
        parse_request(body)
    err = caught.value
    assert (err.status, err.error_type, err.param) == (400, "invalid_request_error", param)
    assert err.message.startswith(f"{param}: ")


def test_limits_are_the_sdk_documented_ones():
    # decision_create_params: "Ask 1-400 questions"; DecisionInputJSON: "32 container
    # levels, 10,000 values, and 256 KiB of compact UTF-8 JSON".
    assert (MAX_QUESTIONS, MAX_JSON_DEPTH, MAX_JSON_VALUES, MAX_JSON_BYTES) == (
        400,
        32,
        10_000,
        262_144,
    )


@pytest.mark.parametrize(
    "body",
    [
        _body(questions=[PREDICATE] * MAX_QUESTIONS),
        _body(questions=[{**CHOICE, "choices": [{"value": f"o{i}"} for i in range(255)]}]),
        _body(questions=[{**SCORE, "levels": [{"label": str(i)} for i in range(10)]}]),
        _body(_json_input(_nested(MAX_JSON_DEPTH))),
        _body(_json_input({"v": list(range(MAX_JSON_VALUES - 2))})),
        _body(
            prompt_cache_key="k",
            safety_identifier="u1",
            prompt_cache_options={"mode": "explicit", "ttl": "30m"},
        ),
    ],
)
def test_limits_are_inclusive_and_cache_fields_are_accepted(body):
    parse_request(body)


def _outcome(question, probs, best, evaluated, reads):
    return Outcome(Decision(question, probs, 0.9, best), (), "llama", 50, evaluated, reads)


def test_response_body_has_the_sdk_decision_shape():
    call = parse_request(
        _body(
            questions=[
                {**PREDICATE, "name": "refund"},
                {
                    "type": "choice",
                    "instructions": "x",
                    "choices": [{"value": "a"}, {"value": False}, {"value": "c"}],
                },
                {**SCORE, "name": "urgency"},
            ]
        )
    )
    q = call.questions
    outcomes = {
        "0": _outcome(q["0"], (0.75, 0.25), 0, 40, 1),
        "1": _outcome(q["1"], (0.25, 0.5, 0.25), 1, 3, 1),
        "2": _outcome(q["2"], (0.25, 0.75), 1, 5, 2),
    }
    body = response_body(call, outcomes)
    assert body == {
        "model": "m",
        "answers": [
            {"type": "predicate", "name": "refund", "probability": 0.75},
            {
                "type": "choice",
                "name": None,
                "choice": False,
                "confidence": 0.25,
                "probabilities": [
                    {"value": "a", "probability": 0.25},
                    {"value": False, "probability": 0.5},
                    {"value": "c", "probability": 0.25},
                ],
            },
            {
                "type": "score",
                "name": "urgency",
                "score": 0.75,
                "confidence": 0.5,
                "probabilities": [
                    {"label": "low", "value": 0, "probability": 0.25},
                    {"label": "high", "value": 1, "probability": 0.75},
                ],
            },
        ],
        # OpenAI's meaning: every prompt token (3 x 50), of which 50 - evaluated cached
        "usage": {
            "input_tokens": 150,
            "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 10 + 47 + 45},
            "output_tokens": 4,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 154,
        },
    }
    parsed = SdkDecision.model_validate(body)
    assert parsed.model_dump() == body and parsed.answers[1].choice is False
    shapes = [
        (body["answers"][0], AnswerAnswerResourcePredicate),
        (body["answers"][1], AnswerAnswerResourceChoice),
        (body["answers"][1]["probabilities"][0], AnswerAnswerResourceChoiceProbability),
        (body["answers"][2], AnswerAnswerResourceScore),
        (body["answers"][2]["probabilities"][0], AnswerAnswerResourceScoreProbability),
        (body["usage"], Usage),
        (body, SdkDecision),
    ]
    for part, sdk_type in shapes:
        assert set(part) == set(sdk_type.model_fields)


SCORE_BLANK_LABEL = {
    "model": "jev-latest",
    "input": "x",
    "questions": [
        {
            "type": "score",
            "instructions": "How urgent?",
            "levels": [{"label": "low"}, {"label": " "}],
        }
    ],
}


async def test_a_rule_the_model_alone_declares_is_the_documents_and_the_routes():
    """A blank level label is refused by ``DecisionsRequest`` alone (no hand check is left):
    the published schema says so with the same pattern, and the route answers the model's
    refusal, naming the field."""
    from aiohttp.test_utils import TestClient, TestServer

    from proxy.app import create_app
    from proxy.config import Settings
    from proxy.openapi import openapi_document
    from proxy.protocol.decisions import DecisionsRequest

    label = DecisionsRequest.model_json_schema()["$defs"]["_Level"]["properties"]["label"]
    schemas = openapi_document()["components"]["schemas"]
    assert [s["properties"]["label"] for s in schemas.values() if s.get("title") == "_Level"] == [
        label
    ]
    settings = Settings(upstream_url="http://127.0.0.1:9")
    async with TestClient(TestServer(create_app(settings))) as client:
        resp = await client.post("/v1/decisions", json=SCORE_BLANK_LABEL)
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["param"] == "questions.0.levels.1.label"
    assert error["message"] == "questions.0.levels.1.label: must not be empty"
    assert not re.search(label["pattern"], " \x1c")
