"""POST /invocations (SageMaker): one path for every body the proxy understands,
told apart by shape:

    {"messages": [...], ...}              chat completions (with or without semif)
    {"state": ..., "questions": {...}}    System One
    {"input": ..., "questions": [...]}    OpenAI Decisions
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..app_keys import API
from ..errors import InvalidRequest
from .chat import chat_completions
from .common import json_object
from .decisions import decisions
from .systemone import system_one

__all__ = ["invocations", "body_shape"]


async def invocations(request: web.Request) -> web.StreamResponse:
    shape = body_shape(json_object(await request.read()))  # the handlers reuse aiohttp's copy
    if shape == "chat":
        return await chat_completions(request)
    if shape == "systemone":
        request[API] = "systemone"
        return await system_one(request)
    return await decisions(request)


def body_shape(body: dict[str, Any]) -> str:
    """Which API a body belongs to: "chat", "systemone" or "decisions"."""
    if "messages" in body:
        return "chat"
    if "state" in body and isinstance(body.get("questions"), dict):
        return "systemone"
    if "input" in body and isinstance(body.get("questions"), list):
        return "decisions"
    raise InvalidRequest(
        "the body is neither a chat completion (messages), a System One request "
        "(state, questions{}) nor a Decisions request (input, questions[])",
        code="unknown_body_shape",
    )
