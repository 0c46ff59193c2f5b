"""Bodies the proxy relays to llama-server: checked so that a client's mistake gets our
400 rather than llama-server's 500, and generations bounded in length.

Chat bodies (``CHAT_PATHS``: ``/v1/chat/completions`` without ``semif``, so ``/invocations``
chat bodies too, and llama-server's other paths that read OpenAI messages) are checked as
OpenAI's shape down to the content parts (``check_chat``). llama-server b11434 answers 500
("Failed to parse messages", "Failed to parse tools") for a part without its field, a
``name`` that is not a string, a malformed tool call or tool; and it answers an empty
``messages`` with a generation from nothing. Every refusal is an ``InvalidRequest`` (400)
whose ``param`` names the field: ``messages.0.content.1.text``.

Generations (``GENERATIONS``, by upstream path) are bounded by ``cap`` tokens
(``--relay-max-tokens``): a body that names no length gets the cap inserted; one that asks
for more, or for no limit (``-1``), is refused with a 400 naming the cap and the setting,
as is a length that is not an integer from 0 up.
llama-server reads the length from the first of ``n_predict``, ``max_completion_tokens``,
``max_tokens`` that is not null (Anthropic's ``/v1/messages``: ``max_tokens`` alone, 4096
when absent; the Responses API: ``max_output_tokens``, which replaces ``max_tokens``), and
generates until the slot's context is full when none is given.

``relayed_body`` applies both and returns the bytes to send: the client's own bytes when
nothing was inserted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import ConfigDict, Field, JsonValue
from pydantic.json_schema import SkipJsonSchema

from ..config import environment_variable
from ..errors import InvalidRequest
from .wire import CONTENT_OR_CALLS, Count, Open, TextPart, ToolCall

__all__ = [
    "CHAT_PATHS",
    "GENERATIONS",
    "PART_FIELDS",
    "MESSAGE_STRINGS",
    "check_tool_call",
    "Generation",
    "Message",
    "ChatPassThroughRequest",
    "CompletionsRequest",
    "EmbeddingsRequest",
    "RelayedChatCompletion",
    "check_chat",
    "length_to_insert",
    "relayed_body",
]

# The documented pass-through bodies: the fields the proxy checks or bounds, as text
# conversations. ``check_chat`` also passes image, audio and video parts and the other
# message fields on to llama-server, which may answer them with its own errors; those
# stay out of the document, so that a body valid in it never gets llama-server's 500.
_TOKENS = (
    "at most the proxy's --relay-max-tokens (2048 by default; 400 above), which is "
    "inserted when the request names no length"
)


_STREAM = "null is false, as in OpenAI's API and llama-server"


class Message(Open):
    """An OpenAI chat message; roles stay free (a chat template may know others)."""

    model_config = ConfigDict(json_schema_extra=CONTENT_OR_CALLS)
    role: str
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | SkipJsonSchema[None] = None


class ChatPassThroughRequest(Open):
    """A chat completion without ``semif``: passed to llama-server (streaming too)."""

    semif: None = None
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Count | None = Field(None, description=_TOKENS)
    stream: bool | None = Field(False, description=_STREAM)


class CompletionsRequest(Open):
    prompt: str | list[JsonValue]
    max_tokens: Count | None = Field(None, description=_TOKENS)
    stream: bool | None = Field(False, description=_STREAM)


class EmbeddingsRequest(Open):
    input: str | list[JsonValue]


class _RelayedChoice(Open):
    index: Count
    message: dict[str, JsonValue] | None = None
    finish_reason: str | None = None


class RelayedChatCompletion(Open):
    """llama-server's own ``chat.completion``, relayed unchanged."""

    object: Literal["chat.completion"]
    choices: list[_RelayedChoice]


# llama-server's paths whose body is an OpenAI chat body (b11434's route table)
CHAT_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/chat/completions/input_tokens",
        "/chat/completions/input_tokens",
        "/apply-template",
    }
)


@dataclass(frozen=True)
class Generation:
    """How one generation path names its length: ``insert`` is the field the cap goes in
    when the body names none; ``read`` the fields llama-server takes the length from, the
    first one not null winning; ``replaces`` a field of ``read`` that llama-server ignores
    once the body has ``insert`` at all (it overwrites it with ``insert``'s value)."""

    insert: str
    read: tuple[str, ...]
    replaces: str | None = None


_LENGTH = ("n_predict", "max_completion_tokens", "max_tokens")  # llama-server's precedence
_OPENAI = Generation("max_tokens", _LENGTH)
_NATIVE = Generation("n_predict", _LENGTH)
_RESPONSES = Generation(
    "max_output_tokens", (*_LENGTH[:2], "max_output_tokens", "max_tokens"), replaces="max_tokens"
)
GENERATIONS: dict[str, Generation] = {
    "/v1/chat/completions": _OPENAI,
    "/chat/completions": _OPENAI,
    "/v1/completions": _OPENAI,
    "/completion": _NATIVE,
    "/completions": _NATIVE,
    "/infill": _NATIVE,
    "/v1/responses": _RESPONSES,
    "/responses": _RESPONSES,
    "/v1/messages": Generation("max_tokens", ("max_tokens",)),  # Anthropic's: nothing else
}

# content part type -> (its object's field, what that object needs: for each entry, one
# of its names holding a string); text parts need a string ``text`` of their own
PART_FIELDS: dict[str, tuple[str, tuple[tuple[str, ...], ...]]] = {
    "image_url": ("image_url", (("url",),)),
    "input_audio": ("input_audio", (("data",), ("format",))),
    "video_url": ("video_url", (("url",),)),  # llama-server's, as OpenAI would name video
    "input_video": ("input_video", (("data", "url"),)),  # llama-server's
}
_PART_TYPES = ("text", *PART_FIELDS)
MESSAGE_STRINGS = ("name", "tool_call_id", "reasoning_content")  # llama-server: no null


def relayed_body(path: str, body: dict[str, Any], raw: bytes, cap: int) -> bytes:
    """The bytes to relay to ``path`` for the client's ``body`` (parsed from ``raw``):
    a chat body checked, a generation bounded to ``cap`` tokens (0: unbounded)."""
    if path in CHAT_PATHS:
        check_chat(body)
    generation = GENERATIONS.get(path)
    if generation is None or cap <= 0:
        return raw
    insert = length_to_insert(body, generation, cap)
    return raw if insert is None else orjson.dumps({**body, generation.insert: insert})


def generation_tokens(path: str, body: dict[str, Any], cap: int) -> int | None:
    """The most tokens a relayed request to ``path`` generates: what the body asks for
    (checked by ``relayed_body`` first), else ``cap``; None when ``path`` generates
    nothing or neither bounds it."""
    generation = GENERATIONS.get(path)
    if generation is None:
        return None
    for name in generation.read:
        if name == generation.replaces and generation.insert in body:
            continue
        value = body.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return int(value)
    return cap if cap > 0 else None


def length_to_insert(body: dict[str, Any], generation: Generation, cap: int) -> int | None:
    """``cap`` when the body names no length llama-server would read, None when it names
    one within the cap; refused (400) when it asks for more than ``cap``, for no limit, or
    for a length that is not an integer (OpenAI's rule; llama-server would cut 2.5 to 2
    and read ``true`` as 1); ``16.0`` is the integer 16."""
    for name in generation.read:
        if name == generation.replaces and generation.insert in body:
            continue
        value = body.get(name)
        if value is not None:
            _check_length(name, value, cap)
            return None
    return cap


def _check_length(name: str, value: object, cap: int) -> None:
    setting = f"--relay-max-tokens, {environment_variable('relay_max_tokens')}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON's 16.0 is the integer 16 (JSON Schema's rule too)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer from 0 to {cap}", param=name)
    if value == -1:
        raise InvalidRequest(
            f"{name} -1 asks for no limit; this server caps relayed generations at {cap} "
            f"tokens ({setting}): ask for at most {cap}",
            param=name,
            code="over_token_cap",
        )
    if value > cap:
        raise InvalidRequest(
            f"{name} {value} is over this server's cap of {cap} tokens for a relayed "
            f"generation ({setting}): ask for at most {cap}",
            param=name,
            code="over_token_cap",
        )
    if value < 0:
        raise InvalidRequest(f"{name} must be an integer from 0 to {cap}", param=name)


def check_chat(body: dict[str, Any]) -> None:
    """OpenAI's chat shape, as far as llama-server reads it: ``messages`` a non-empty list
    of objects with a string ``role``; ``content`` a string, null or a list of parts, each
    an object of a known ``type`` with its field (``text`` a string; ``image_url`` an
    object with a string ``url``; ``input_audio`` one with string ``data`` and
    ``format``); ``name``, ``tool_call_id``, ``reasoning_content`` strings; tool calls and
    ``tools`` as OpenAI writes them. Roles stay free: a chat template may know others."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            "messages must be a non-empty list of message objects", param="messages"
        )
    for i, message in enumerate(messages):
        _check_message(message, f"messages.{i}")
    _check_tools(body.get("tools"))
    grammar = body.get("grammar")
    if body.get("json_schema") is not None and isinstance(grammar, str) and grammar:
        raise InvalidRequest(
            "grammar and json_schema cannot be combined: send one", param="grammar"
        )


def _check_message(message: object, param: str) -> None:
    if not isinstance(message, dict):
        raise InvalidRequest("each message must be an object", param=param)
    role = message.get("role")
    if not isinstance(role, str):
        raise InvalidRequest(
            'each message needs a role, a string such as "user"',
            param=f"{param}.role",
            code="missing_role",
        )
    if "content" not in message:
        if role != "assistant" or "tool_calls" not in message:
            raise InvalidRequest(
                "each message needs content (an assistant message may have tool_calls instead)",
                param=f"{param}.content",
            )
    content = message.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            _check_part(part, f"{param}.content.{j}")
    elif content is not None and not isinstance(content, str):
        raise InvalidRequest(
            "content must be a string, null or a list of content parts", param=f"{param}.content"
        )
    for field in MESSAGE_STRINGS:
        if field in message and not isinstance(message[field], str):
            raise InvalidRequest(f"{field} must be a string", param=f"{param}.{field}")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise InvalidRequest("tool_calls must be a list", param=f"{param}.tool_calls")
    for k, call in enumerate(calls):
        check_tool_call(call, f"{param}.tool_calls.{k}")


def _check_part(part: object, param: str) -> None:
    if not isinstance(part, dict):
        raise InvalidRequest(
            'each content part must be an object such as {"type": "text", "text": "..."}',
            param=param,
        )
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise InvalidRequest("each text part needs text, a string", param=f"{param}.text")
        return
    if not isinstance(kind, str):
        raise InvalidRequest(
            f"each content part needs a type, a string: one of {', '.join(_PART_TYPES)}",
            param=f"{param}.type",
        )
    if kind not in PART_FIELDS:
        raise InvalidRequest(
            f"content part type {kind!r} is not one llama-server reads: {', '.join(_PART_TYPES)}",
            param=f"{param}.type",
            code="unknown_part_type",
        )
    field, needs = PART_FIELDS[kind]
    inner = part.get(field)
    if not isinstance(inner, dict):
        raise InvalidRequest(
            f"each {kind} part needs {field}, an object with "
            f"{' and '.join(' or '.join(n) for n in needs)}",
            param=f"{param}.{field}",
        )
    for names in needs:
        if not any(isinstance(inner.get(name), str) for name in names):
            raise InvalidRequest(
                f"{field}.{' or '.join(names)} must be a string",
                param=f"{param}.{field}.{names[0]}",
            )


def check_tool_call(call: object, param: str) -> None:
    function = call.get("function") if isinstance(call, dict) else None
    if not (
        isinstance(call, dict)
        and call.get("type") == "function"
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments"), (str, dict))
    ):
        raise InvalidRequest(
            'each tool call must be {"type": "function", "function": '
            '{"name": "...", "arguments": "..."}}',
            param=param,
        )
    if "id" in call and not isinstance(call["id"], str):
        raise InvalidRequest("a tool call's id must be a string", param=f"{param}.id")


def _check_tools(tools: object) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (
            isinstance(tool, dict)
            and tool.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and isinstance(function.get("description", ""), str)
            and isinstance(function.get("parameters", {}), (dict, type(None)))
        ):
            raise InvalidRequest(
                'each tool must be {"type": "function", "function": {"name": "...", '
                '"description": "...", "parameters": {...}}}',
                param=f"tools.{i}",
            )
