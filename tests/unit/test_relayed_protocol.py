"""Relayed bodies: chat bodies checked as OpenAI's shape down to the content parts,
generations bounded by the cap (proxy/protocol/relayed.py)."""

import orjson
import pytest

from proxy.errors import InvalidRequest
from proxy.protocol.relayed import (
    GENERATIONS,
    check_chat,
    generation_tokens,
    length_to_insert,
    relayed_body,
)

HI = {"role": "user", "content": "hi"}


def _part(part):
    return {"messages": [{"role": "user", "content": [part]}]}


def _tool_call(call):
    return {"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}, HI]}


CALL = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({}, "messages", "messages must be a non-empty list of message objects"),
        ({"messages": []}, "messages", "messages must be a non-empty list of message objects"),
        ({"messages": "hi"}, "messages", "messages must be a non-empty list of message objects"),
        ({"messages": [HI, "b"]}, "messages.1", "each message must be an object"),
        (
            {"messages": [{"content": "hi"}]},
            "messages.0.role",
            'each message needs a role, a string such as "user"',
        ),
        (
            {"messages": [HI, {"role": None, "content": "b"}]},
            "messages.1.role",
            'each message needs a role, a string such as "user"',
        ),
        (
            {"messages": [{"role": "user"}]},
            "messages.0.content",
            "each message needs content (an assistant message may have tool_calls instead)",
        ),
        (
            {"messages": [{"role": "assistant"}]},
            "messages.0.content",
            "each message needs content (an assistant message may have tool_calls instead)",
        ),
        (
            {"messages": [{"role": "user", "content": 5}]},
            "messages.0.content",
            "content must be a string, null or a list of content parts",
        ),
        (
            {"messages": [{"role": "user", "content": {}}]},
            "messages.0.content",
            "content must be a string, null or a list of content parts",
        ),
        # what schemathesis found relayed as llama-server's 500
        (
            {"messages": [{"content": [{"type": "text"}], "role": ""}]},
            "messages.0.content.0.text",
            "each text part needs text, a string",
        ),
        (
            _part({"type": "text", "text": 5}),
            "messages.0.content.0.text",
            "each text part needs text, a string",
        ),
        (
            _part("hi"),
            "messages.0.content.0",
            'each content part must be an object such as {"type": "text", "text": "..."}',
        ),
        (
            _part({"text": "hi"}),
            "messages.0.content.0.type",
            "each content part needs a type, a string: one of text, image_url, input_audio, "
            "video_url, input_video",
        ),
        (
            _part({"type": 5}),
            "messages.0.content.0.type",
            "each content part needs a type, a string: one of text, image_url, input_audio, "
            "video_url, input_video",
        ),
        (
            _part({"type": "martian"}),
            "messages.0.content.0.type",
            "content part type 'martian' is not one llama-server reads: text, image_url, "
            "input_audio, video_url, input_video",
        ),
        (
            _part({"type": "file", "file": {"file_id": "f"}}),
            "messages.0.content.0.type",
            "content part type 'file' is not one llama-server reads: text, image_url, "
            "input_audio, video_url, input_video",
        ),
        (
            _part({"type": "image_url"}),
            "messages.0.content.0.image_url",
            "each image_url part needs image_url, an object with url",
        ),
        (
            _part({"type": "image_url", "image_url": "http://x/a.png"}),
            "messages.0.content.0.image_url",
            "each image_url part needs image_url, an object with url",
        ),
        (
            _part({"type": "image_url", "image_url": {"detail": "low"}}),
            "messages.0.content.0.image_url.url",
            "image_url.url must be a string",
        ),
        (
            _part({"type": "input_audio", "input_audio": {"data": "UklGR"}}),
            "messages.0.content.0.input_audio.format",
            "input_audio.format must be a string",
        ),
        (
            _part({"type": "input_audio", "input_audio": {"format": "wav"}}),
            "messages.0.content.0.input_audio.data",
            "input_audio.data must be a string",
        ),
        (
            _part({"type": "input_video", "input_video": {}}),
            "messages.0.content.0.input_video.data",
            "input_video.data or url must be a string",
        ),
        ({"messages": [{**HI, "name": 5}]}, "messages.0.name", "name must be a string"),
        ({"messages": [{**HI, "name": None}]}, "messages.0.name", "name must be a string"),
        (
            {"messages": [{**HI, "tool_call_id": 5}]},
            "messages.0.tool_call_id",
            "tool_call_id must be a string",
        ),
        (
            {"messages": [{**HI, "reasoning_content": None}]},
            "messages.0.reasoning_content",
            "reasoning_content must be a string",
        ),
        (
            {"messages": [{"role": "assistant", "content": "a", "tool_calls": 5}]},
            "messages.0.tool_calls",
            "tool_calls must be a list",
        ),
        (
            _tool_call({"function": {"name": "f", "arguments": "{}"}}),
            "messages.0.tool_calls.0",
            'each tool call must be {"type": "function", "function": {"name": "...", '
            '"arguments": "..."}}',
        ),
        (
            _tool_call({"type": "function", "function": {"name": "f"}}),
            "messages.0.tool_calls.0",
            'each tool call must be {"type": "function", "function": {"name": "...", '
            '"arguments": "..."}}',
        ),
        (
            _tool_call({"type": "function", "function": {"name": 5, "arguments": "{}"}}),
            "messages.0.tool_calls.0",
            'each tool call must be {"type": "function", "function": '
            '{"name": "...", "arguments": "..."}}',
        ),
        (
            _tool_call({**CALL, "id": None}),
            "messages.0.tool_calls.0.id",
            "a tool call's id must be a string",
        ),
        ({"messages": [HI], "tools": 5}, "tools", "tools must be a list"),
        (
            {"messages": [HI], "tools": [5]},
            "tools.0",
            'each tool must be {"type": "function", "function": {"name": "...", '
            '"description": "...", "parameters": {...}}}',
        ),
        (
            {
                "messages": [HI],
                "tools": [{"type": "function", "function": {"name": "f", "description": 5}}],
            },
            "tools.0",
            'each tool must be {"type": "function", "function": {"name": "...", '
            '"description": "...", "parameters": {...}}}',
        ),
        (
            {"messages": [HI], "json_schema": {"type": "object"}, "grammar": 'root ::= "a"'},
            "grammar",
            "grammar and json_schema cannot be combined: send one",
        ),
    ],
)
def test_a_chat_body_llama_server_cannot_read_is_refused_naming_the_field(body, param, message):
    with pytest.raises(InvalidRequest) as err:
        check_chat(body)
    assert (err.value.status, err.value.param, err.value.message) == (400, param, message)


def test_an_unknown_part_type_has_its_own_code():
    with pytest.raises(InvalidRequest) as err:
        check_chat(_part({"type": "refusal", "refusal": "no"}))
    assert err.value.code == "unknown_part_type"


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [HI]},
        {"messages": [{"role": "martian", "content": "hi"}]},  # a template may know the role
        {"messages": [{"role": "", "content": "hi"}]},
        {"messages": [{"role": "user", "content": None}]},
        {"messages": [{"role": "user", "content": []}]},
        _part({"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}),
        _part(
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
            }
        ),
        _part({"type": "input_audio", "input_audio": {"data": "UklGR", "format": "wav"}}),
        _part({"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}),
        _part({"type": "input_video", "input_video": {"url": "http://x/v.mp4"}}),
        {"messages": [{"role": "assistant", "tool_calls": [CALL]}, HI]},
        {"messages": [{"role": "assistant", "tool_calls": None}, HI]},
        _tool_call({**CALL, "id": "call_1", "function": {"name": "f", "arguments": {"a": 1}}}),
        {"messages": [HI], "tools": [TOOL], "tools_choice": "auto"},
        {"messages": [HI], "tools": None, "grammar": 'root ::= "a"'},
        {"messages": [HI], "json_schema": {"type": "object"}, "grammar": ""},
    ],
)
def test_what_llama_server_reads_passes(body):
    check_chat(body)


CAP = 2048
CHAT, NATIVE, RESPONSES, ANTHROPIC = (
    GENERATIONS[p] for p in ("/v1/chat/completions", "/completion", "/v1/responses", "/v1/messages")
)


@pytest.mark.parametrize(
    ("generation", "body", "expected"),
    [
        (CHAT, {}, CAP),
        (CHAT, {"max_tokens": None}, CAP),  # null is llama-server's "absent"
        (CHAT, {"max_tokens": 16}, None),
        (CHAT, {"max_tokens": CAP}, None),
        (CHAT, {"max_tokens": 16.0}, None),  # JSON's integer 16
        (CHAT, {"max_completion_tokens": 0}, None),
        (CHAT, {"n_predict": 16, "max_tokens": 10**6}, None),  # n_predict wins upstream
        (CHAT, {"max_completion_tokens": 16, "max_tokens": 10**6}, None),
        (NATIVE, {}, CAP),
        (NATIVE, {"n_predict": None, "max_tokens": 8}, None),
        (RESPONSES, {}, CAP),
        (RESPONSES, {"max_output_tokens": 8}, None),
        (RESPONSES, {"max_tokens": 8}, None),  # read when max_output_tokens is absent
        (RESPONSES, {"max_output_tokens": None, "max_tokens": 8}, CAP),  # ... replaced when not
        (ANTHROPIC, {}, CAP),  # llama-server's own default is 4096
        (ANTHROPIC, {"max_tokens": 8}, None),
        (ANTHROPIC, {"n_predict": 8}, CAP),  # dropped by llama-server's conversion
    ],
)
def test_the_cap_goes_in_where_no_length_is_named(generation, body, expected):
    assert length_to_insert(body, generation, CAP) == expected


@pytest.mark.parametrize(
    ("generation", "body", "param", "message"),
    [
        (
            CHAT,
            {"max_tokens": 4000},
            "max_tokens",
            "max_tokens 4000 is over this server's cap of 2048 tokens for a relayed generation "
            "(--relay-max-tokens, PROXY_RELAY_MAX_TOKENS): ask for at most 2048",
        ),
        (
            CHAT,
            {"max_tokens": 4000.0},
            "max_tokens",
            "max_tokens 4000 is over this server's cap of 2048 tokens for a relayed generation "
            "(--relay-max-tokens, PROXY_RELAY_MAX_TOKENS): ask for at most 2048",
        ),
        (
            CHAT,
            {"n_predict": -1, "max_tokens": 3},
            "n_predict",
            "n_predict -1 asks for no limit; this server caps relayed generations at 2048 tokens "
            "(--relay-max-tokens, PROXY_RELAY_MAX_TOKENS): ask for at most 2048",
        ),
        (
            NATIVE,
            {"max_completion_tokens": 10**9},
            "max_completion_tokens",
            "max_completion_tokens 1000000000 is over this server's cap of 2048 tokens"
            " for a relayed "
            "generation (--relay-max-tokens, PROXY_RELAY_MAX_TOKENS): ask for at most 2048",
        ),
        (
            RESPONSES,
            {"max_output_tokens": 5000},
            "max_output_tokens",
            "max_output_tokens 5000 is over this server's cap of 2048 tokens for a relayed "
            "generation (--relay-max-tokens, PROXY_RELAY_MAX_TOKENS): ask for at most 2048",
        ),
        (
            ANTHROPIC,
            {"max_tokens": -1},
            "max_tokens",
            "max_tokens -1 asks for no limit; this server caps relayed generations at 2048 tokens "
            "(--relay-max-tokens, PROXY_RELAY_MAX_TOKENS): ask for at most 2048",
        ),
    ],
)
def test_more_than_the_cap_is_refused_naming_the_cap_and_the_setting(
    generation, body, param, message
):
    with pytest.raises(InvalidRequest) as err:
        length_to_insert(body, generation, CAP)
    assert (err.value.status, err.value.param, err.value.code, err.value.message) == (
        400,
        param,
        "over_token_cap",
        message,
    )


@pytest.mark.parametrize("value", ["x", True, 2.7, -2, -2.0, {}, [8]])
def test_a_length_that_is_not_an_integer_from_0_is_refused(value):
    with pytest.raises(InvalidRequest) as err:
        length_to_insert({"max_tokens": value}, CHAT, CAP)
    assert (err.value.status, err.value.param, err.value.code, err.value.message) == (
        400,
        "max_tokens",
        "invalid_request",
        "max_tokens must be an integer from 0 to 2048",
    )


def test_a_body_with_its_length_goes_as_the_clients_bytes():
    raw = b'{"prompt":  "hi", "n_predict": 8}'
    assert relayed_body("/completion", orjson.loads(raw), raw, CAP) is raw


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/chat/completions", "max_tokens"),
        ("/v1/completions", "max_tokens"),
        ("/completion", "n_predict"),
        ("/completions", "n_predict"),
        ("/infill", "n_predict"),
        ("/v1/responses", "max_output_tokens"),
        ("/v1/messages", "max_tokens"),
    ],
)
def test_a_body_without_a_length_gets_the_cap_and_keeps_the_rest(path, field):
    body = {"messages": [HI], "prompt": "hi", "max_tokens": None, "temperature": 0.25}
    sent = orjson.loads(relayed_body(path, body, orjson.dumps(body), 64))
    assert sent == {**body, field: 64}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/completion"])
def test_a_cap_of_zero_bounds_nothing(path):
    body = {"messages": [HI], "prompt": "hi", "n_predict": -1}
    raw = orjson.dumps(body)
    assert relayed_body(path, body, raw, 0) is raw


@pytest.mark.parametrize(
    "path", ["/chat/completions", "/v1/chat/completions/input_tokens", "/apply-template"]
)
def test_llama_servers_other_chat_paths_are_checked_too(path):
    body = {"messages": [{"role": "user", "content": [{"type": "text"}]}]}
    with pytest.raises(InvalidRequest) as err:
        relayed_body(path, body, orjson.dumps(body), CAP)
    assert err.value.param == "messages.0.content.0.text"


def test_other_paths_go_unread():
    raw = b'{"input": "hi"}'
    assert relayed_body("/v1/embeddings", {"input": "hi"}, raw, CAP) is raw


@pytest.mark.parametrize(
    ("path", "body", "tokens"),
    [
        ("/v1/chat/completions", {"messages": []}, 2048),
        ("/v1/chat/completions", {"max_tokens": 16}, 16),
        ("/v1/chat/completions", {"max_tokens": 16, "n_predict": 4}, 4),
        ("/completion", {"n_predict": 7}, 7),
        ("/v1/responses", {"max_output_tokens": 9}, 9),
        ("/tokenize", {"content": "x"}, None),
    ],
)
def test_generation_tokens(path, body, tokens):
    assert generation_tokens(path, body, 2048) == tokens
