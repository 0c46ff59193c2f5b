import math

import pytest

from proxy.errors import InvalidRequest
from proxy.protocol.semif import parse_chat

MANY = [f"o{i}" for i in range(256)]
BASE = {"messages": [{"role": "user", "content": "hi"}]}


def _semif_call(semif):
    """The call a chat body with ``semif`` asks (``parse_chat`` validates the whole body)."""
    return parse_chat({**BASE, "semif": semif}).call


def _parse_body(body):
    parse_chat({"semif": {"options": ["a", "b"]}, **body})


@pytest.mark.parametrize(
    ("semif", "param", "says"),
    [
        ("billing", "semif", "must be an object"),
        ({}, "semif.options", "required"),
        ({"options": []}, "semif.options", "at least 2"),
        (
            {"options": ["a", "b"], "layout": "sideways"},
            "semif.layout",
            "'conversation_first' or 'options_first'",
        ),
        ({"options": ["only"]}, "semif.options", "at least 2"),
        ({"options": MANY}, "semif.options", "at most 255"),
        ({"options": ["Billing", " billing "]}, "semif.options", "case-folding"),
        ({"options": ["ß", "SS"]}, "semif.options", "case-folding"),  # casefold, not lower
        ({"options": ["a", 3]}, "semif.options.1", "strings"),
        ({"options": ["a", "  "]}, "semif.options.1", "empty"),
        ({"options": {"a": "x", "b": 5}}, "semif.options.b", "string, object, array or null"),
        ({"options": "a,b"}, "semif.options", "list of names"),
        ({"type": "ranking", "options": ["a", "b"]}, "semif.type", "choice"),
        ({"type": "score", "options": ["low"]}, "semif.options", "2 to 10"),
        ({"type": "score", "options": [str(i) for i in range(11)]}, "semif.options", "2 to 10"),
        ({"type": "score", "options": {"low": None, "high": None}}, "semif.options", "list"),
        ({"type": "score", "options": ["low", None]}, "semif.options.1", "non-empty string"),
        ({"type": "noul", "options": {"maybe": "?"}}, "semif.options", "only"),
        ({"type": "noul", "options": ["true", "false"]}, "semif.options", "object"),
        ({"options": ["a", "b"], "temperature": 0}, "semif.temperature", "positive"),
        ({"options": ["a", "b"], "temperature": -1.5}, "semif.temperature", "positive"),
        ({"options": ["a", "b"], "temperature": math.inf}, "semif.temperature", "finite"),
        ({"options": ["a", "b"], "temperature": "1"}, "semif.temperature", "number"),
        ({"options": ["a", "b"], "temperature": True}, "semif.temperature", "number"),
        ({"options": ["a", "b"], "labels": ["x"]}, "semif.labels", "not permitted"),
        ({"options": ["a", "b"], "debias": "random"}, "semif.debias", "cyclic"),
        (
            {"options": ["a", "b"], "debias": {"method": "cyclic", "rotations": 3}},
            "semif.debias",
            "between 1 and",
        ),
        (
            {"options": ["a", "b"], "debias": {"method": "cyclic", "rotations": "2"}},
            "semif.debias",
            "integer",
        ),
        ({"type": "score", "options": ["a", "b"], "debias": "cyclic"}, "semif.debias", "ordered"),
        ({"options": ["a", "b"], "calibration": 7}, "semif.calibration", "string"),
    ],
)
def test_invalid_semif_is_refused_naming_the_field(semif, param, says):
    with pytest.raises(InvalidRequest) as caught:
        _semif_call(semif)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert says in caught.value.message


@pytest.mark.parametrize(
    ("semif", "kind", "names"),
    [
        ({"options": ["billing", "shipping"]}, "choice", ("billing", "shipping")),
        ({"options": {"🚚 ship": None, "bill": "money"}}, "choice", ("🚚 ship", "bill")),
        ({"type": "noul"}, "noul", ("true", "false")),
        ({"type": "noul", "options": {"true": "spam"}}, "noul", ("true", "false")),
        ({"type": "score", "options": ["a", "b", "c"]}, "score", ("0", "1", "2")),
        ({"options": MANY[:255], "temperature": 2}, "choice", tuple(MANY[:255])),
    ],
)
def test_valid_semif(semif, kind, names):
    q = _semif_call(semif).question
    assert (q.kind, q.names) == (kind, names)
    assert q.temperature == float(semif.get("temperature", 1.0))


def _call(**fields):
    """A tool call as OpenAI writes it, with ``fields`` replaced."""
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}, **fields}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages.0.role"),
        ({"chat_template_kwargs": "thinking"}, "chat_template_kwargs"),
        ({"n": True}, "n"),
        ({"tools": {}}, "tools"),
        ({"tools": False}, "tools"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": ["user"], "content": "x"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text",
        ),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": 5}]},
            "messages.0.tool_calls",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x", "tool_calls": [{}]}]},
            "messages.0.tool_calls.0.type",
        ),
        (
            {"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]},
            "messages.0.tool_call_id",
        ),
        # what llama-server's /apply-template answers with a 500 (b11434): refused first
        ({"messages": [{"role": "user", "content": "x", "name": None}]}, "messages.0.name"),
        (
            {"messages": [{"role": "tool", "content": "x", "tool_call_id": None}]},
            "messages.0.tool_call_id",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x", "reasoning_content": None}]},
            "messages.0.reasoning_content",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x", "tool_calls": [_call(id=[1])]}]},
            "messages.0.tool_calls.0.id",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x", "tool_calls": [_call(type="x")]}]},
            "messages.0.tool_calls.0.type",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x", "tool_calls": [_call(type=None)]}]},
            "messages.0.tool_calls.0.type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": "x",
                        "tool_calls": [_call(function={"name": "f", "arguments": {}})],
                    }
                ]
            },
            "messages.0.tool_calls.0.function.arguments",
        ),
    ],
)
def test_incompatible_fields_are_refused(extra, param):
    with pytest.raises(InvalidRequest) as caught:
        _parse_body({**BASE, **extra})
    assert caught.value.param == param


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"n": 1},
        {"tools": []},
        {"tools": None},
        {"response_format": None},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"messages": [{"role": "assistant", "content": None, "tool_calls": []}]},
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ]
        },
    ],
)
def test_compatible_fields_pass(extra):
    _parse_body({**BASE, **extra})


@pytest.mark.parametrize(
    ("debias", "expected"),
    [(None, ()), ("cyclic", (0, 1, 2)), ({"method": "cyclic", "rotations": 2}, (0, 1))],
)
def test_debias_becomes_the_shifts_to_read(debias, expected):
    assert _semif_call({"options": ["a", "b", "c"], "debias": debias}).debias == expected


def test_repeated_calls_are_parsed_once_and_option_order_still_counts():
    first = _semif_call({"options": {"b": "bee", "a": None}, "temperature": 2})
    again = _semif_call({"options": {"b": "bee", "a": None}, "temperature": 2})
    reordered = _semif_call({"options": {"a": None, "b": "bee"}, "temperature": 2})
    assert again is first
    assert first.question.names == ("b", "a") and reordered.question.names == ("a", "b")


def test_invalid_calls_are_refused_every_time():
    for _ in range(2):
        with pytest.raises(InvalidRequest, match="at least 2"):
            _semif_call({"options": ["only"]})


def test_very_large_calls_are_parsed_but_not_remembered():
    from proxy.protocol import semif

    big = {"options": {"a": "x" * 10_000, "b": None}}
    assert _semif_call(big) is not _semif_call(big)
    assert all(len(key) <= semif._MAX_KEY_BYTES for key in semif._PARSED)


@pytest.mark.parametrize(
    "semif, layout",
    [
        ({"options": ["a", "b"]}, "conversation_first"),
        ({"options": ["a", "b"], "layout": "options_first"}, "options_first"),
    ],
)
def test_the_layout_is_a_field_of_the_request(semif, layout):
    assert _semif_call(semif).layout == layout


async def test_a_rule_the_model_alone_declares_is_the_documents_and_the_routes():
    """``top_logprobs`` at most 20 and a message's role are declared by
    ``ChatDecisionRequest`` alone (no hand check is left): the published schema says so,
    and the chat route answers the model's refusal, naming the field."""
    from aiohttp.test_utils import TestClient, TestServer

    from proxy.app import create_app
    from proxy.config import Settings
    from proxy.openapi import openapi_document

    schemas = openapi_document()["components"]["schemas"]
    top = schemas["ChatDecisionRequest"]["properties"]["top_logprobs"]["anyOf"][0]
    assert top["maximum"] == 20
    assert set(schemas["DecisionMessage"]["properties"]["role"]["enum"]) == {
        "system",
        "developer",
        "user",
        "assistant",
        "tool",
    }
    settings = Settings(upstream_url="http://127.0.0.1:9")
    semif = {"options": ["a", "b"]}
    async with TestClient(TestServer(create_app(settings))) as client:
        resp = await client.post(
            "/v1/chat/completions",
            json={**BASE, "semif": semif, "logprobs": True, "top_logprobs": 21},
        )
        assert resp.status == 400
        top_error = (await resp.json())["error"]
        resp = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "robot", "content": "x"}], "semif": semif},
        )
        assert resp.status == 400
        role_error = (await resp.json())["error"]
    assert top_error["param"] == "top_logprobs"
    assert top_error["message"] == "top_logprobs: Input should be less than or equal to 20"
    assert role_error["param"] == "messages.0.role"
