"""The OpenAPI 3.1 document of every route, built once.

Every request and response body is a pydantic model of ``protocol/``: their JSON
Schemas (requests ``validation``, responses ``serialization``) are generated together
into ``components/schemas``, named after their classes (without a leading underscore).
The paths, their status codes and media types are listed here. Errors follow
``errors.py``: OpenAI routes answer ``{"error": {...}}``; System One answers 422
``{"detail": [{loc, msg, type}]}`` for validation and ``{"detail": "..."}`` otherwise.
Bodies llama-server answers itself (pass-through) are documented as open objects.

Longer than 400 lines on purpose: most of it is the one table of every path, its status
codes and media types, kept together so that the document is read and reviewed as one.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from . import __version__
from .decision.prompt import PROMPT_FORMAT_VERSIONS
from .protocol.chat import ChatCompletion, ChatCompletionChunk
from .protocol.decisions import DecisionsRequest, DecisionsResponse
from .protocol.error_bodies import DetailError, ErrorRecord, OpenAIError, ValidationError
from .protocol.meta import (
    Alive,
    ExecutionParameters,
    Health,
    ModelList,
    ModelObject,
)
from .protocol.relayed import (
    ChatPassThroughRequest,
    CompletionsRequest,
    EmbeddingsRequest,
    RelayedChatCompletion,
)
from .protocol.rerank import RelayedRerank, RerankRequest, RerankResponse
from .protocol.semif import ChatDecisionRequest
from .protocol.systemone import SystemOneRequest, SystemOneResponse

__all__ = ["REQUESTS", "RESPONSES", "openapi_document"]

Schema = dict[str, Any]
_COMPONENTS = "#/components/schemas/"
_JSON = "application/json"

REQUESTS: tuple[type[BaseModel], ...] = (
    ChatDecisionRequest,
    ChatPassThroughRequest,
    SystemOneRequest,
    DecisionsRequest,
    RerankRequest,
    CompletionsRequest,
    EmbeddingsRequest,
)
RESPONSES: tuple[type[BaseModel], ...] = (
    ChatCompletion,
    ChatCompletionChunk,
    RelayedChatCompletion,
    SystemOneResponse,
    DecisionsResponse,
    RerankResponse,
    RelayedRerank,
    ModelList,
    ModelObject,
    Health,
    Alive,
    ExecutionParameters,
    OpenAIError,
    ValidationError,
    DetailError,
    ErrorRecord,
)


def _ref(name: str) -> Schema:
    return {"$ref": _COMPONENTS + name}


def _schemas() -> dict[str, Schema]:
    """Every model's JSON Schema, each model once, under its class name."""
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        *((m, "validation") for m in REQUESTS),
        *((m, "serialization") for m in RESPONSES),
    ]
    _, top = models_json_schema(models, ref_template=_COMPONENTS + "{model}")
    defs: dict[str, Schema] = top["$defs"]
    names = {name: name.lstrip("_") for name in defs}
    # pydantic qualifies a name two models share with their modules (proxy__protocol__...)
    if len(set(names.values())) < len(names) or any("__" in n for n in names):
        raise ValueError(f"two models share a name: {sorted(names)}")

    def renamed(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: renamed(v) for k, v in node.items()}
        if isinstance(node, list):
            return [renamed(v) for v in node]
        if isinstance(node, str) and node.startswith(_COMPONENTS):
            return _COMPONENTS + names[node.removeprefix(_COMPONENTS)]
        return node

    schemas = {names[name]: renamed(schema) for name, schema in defs.items()}
    schemas["ChatRequest"] = {
        "oneOf": [_ref("ChatDecisionRequest"), _ref("ChatPassThroughRequest")]
    }
    return schemas


def _json(schema: Schema) -> dict[str, Schema]:
    return {_JSON: {"schema": schema}}


def _response(
    description: str, content: dict[str, Schema] | None = None, retry_after: bool = False
) -> Schema:
    out: Schema = {"description": description}
    if content:
        out["content"] = content
    if retry_after:
        out["headers"] = {
            "Retry-After": {
                "required": True,
                "schema": {"type": "string"},
                "description": "seconds to wait before retrying",
            }
        }
    return out


# OpenAPI 3.1: the schema of a text/event-stream describes each event.
_EVENTS = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "required": ["data"],
            "properties": {"data": {"type": "string"}},
            "description": "a decision: one ChatCompletionChunk event, then [DONE]",
        }
    }
}
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_WHY = {
    "400": "bad input: invalid JSON, a refused field (``param`` names it), or llama-server "
    "refused the request built from it (pass-through: llama-server's own 4xx)",
    "401": "missing or wrong ``Authorization: Bearer`` key (only when the proxy has one)",
    "404": "no model by that name",
    "413": "body larger than --max-body-bytes",
    "422": "System One validation: one entry per refused field",
    "429": "too many decisions in flight and queued",
    "501": "llama-server was started without --embeddings (its own answer)",
    "502": "llama-server answered with something the proxy cannot use",
    "503": "llama-server is unreachable or still loading",
    "504": "no answer within the deadline",
}


# Pass-through answers keep llama-server's status and body, its 500s included
# (e.g. for message parts it cannot parse); the proxy itself never answers 500.
_RELAYED_500 = {
    "500": _response(
        "pass-through only: llama-server's own error, relayed unchanged", _json({"type": "object"})
    )
}


def _errors(codes: str, shape: Schema) -> dict[str, Schema]:
    return {
        c: _response(_WHY[c], _json(shape), retry_after=c in ("429", "503")) for c in codes.split()
    }


def _operation(
    summary: str,
    ok: Schema,
    errors: dict[str, Schema],
    body: Schema | None = None,
    open_route: bool = False,
) -> Schema:
    op: Schema = {"summary": summary, "responses": {"200": ok, **errors}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": _json(body)}
    if open_route:
        op["security"] = []
    return op


_LINES = {
    "application/jsonlines": {
        "schema": {
            "type": "string",
            "description": "one JSON answer (or ErrorRecord) per line, in order",
        }
    }
}


def _jsonlines(op: Schema) -> Schema:
    """The operation also taking an application/jsonlines body."""
    op["requestBody"]["content"].update(_LINES)
    return op


def _paths() -> dict[str, Schema]:
    oa, detail, invalid = _ref("OpenAIError"), _ref("DetailError"), _ref("ValidationError")
    either = {"anyOf": [oa, detail]}
    chat = {"anyOf": [_ref("ChatCompletion"), _ref("RelayedChatCompletion")]}
    answer = {"anyOf": [*chat["anyOf"], _ref("SystemOneResponse"), _ref("DecisionsResponse")]}
    passthrough = "llama-server's answer, unchanged"
    free = {"type": "object", "description": passthrough}
    return {
        "/v1/chat/completions": {
            "post": _operation(
                "OpenAI chat completions; with ``semif`` answered as a decision, otherwise passed "
                "through to llama-server (streaming too)",
                _response(
                    "a chat.completion (with ``semif``) or one chunk and [DONE] when streaming",
                    {**_json(chat), **_EVENTS},
                ),
                {**_errors("400 401 413 429 502 503 504", oa), **_RELAYED_500},
                _ref("ChatRequest"),
            )
        },
        "/v1/systemone": {
            "post": _operation(
                "System One: questions about one state, answered from the served chat model",
                _response("one answer per question id", _json(_ref("SystemOneResponse"))),
                {**_errors("422", invalid), **_errors("400 401 413 429 502 503 504", detail)},
                _ref("SystemOneRequest"),
            )
        },
        "/v1/decisions": {
            "post": _operation(
                "OpenAI Decisions: questions about one input, answered in order",
                _response("a Decision", _json(_ref("DecisionsResponse"))),
                _errors("400 401 413 429 502 503 504", oa),
                _ref("DecisionsRequest"),
            )
        },
        **{
            path: {
                "post": _operation(
                    "Rerank: documents ordered by relevance to a query, read from the served chat "
                    "model (forwarded untouched to a llama-server started with --reranking)",
                    _response(
                        "the documents' scores, best first (top_n of them)",
                        _json({"anyOf": [_ref("RerankResponse"), _ref("RelayedRerank")]}),
                    ),
                    _errors("400 401 413 429 502 503 504", oa),
                    _ref("RerankRequest"),
                )
            }
            for path in ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking", "/v2/rerank")
        },
        "/invocations": {
            "post": _jsonlines(
                _operation(
                    "SageMaker: any body of the three routes above, told apart by its fields; "
                    "application/jsonlines: one such decision request per line (Batch Transform), "
                    "answered line for line",
                    _response(
                        "the answer of the route the body belongs to",
                        {**_json(answer), **_EVENTS, **_LINES},
                    ),
                    {
                        **_errors("401 413", oa),
                        **_errors("422", invalid),
                        **_errors("400 429 502 503 504", either),
                        **_RELAYED_500,
                    },
                    {
                        "anyOf": [
                            _ref("ChatRequest"),
                            _ref("SystemOneRequest"),
                            _ref("DecisionsRequest"),
                        ]
                    },
                )
            )
        },
        "/livez": {
            "get": _operation(
                "liveness of the proxy process alone (never asks llama-server)",
                _response("alive", _json(_ref("Alive"))),
                {},
                open_route=True,
            )
        },
        "/execution-parameters": {
            "get": _operation(
                "SageMaker Batch Transform: how to call /invocations (application/jsonlines, one "
                "decision request per line, answered line for line)",
                _response("the parameters", _json(_ref("ExecutionParameters"))),
                _errors("401", oa),
            )
        },
        "/v1/models": {
            "get": _operation(
                "llama-server's model list plus the System One names this server answers to",
                _response("the models", _json(_ref("ModelList"))),
                _errors("401 502 503 504", oa),
            )
        },
        "/playground": {
            "get": _operation(
                "a page to try decisions by hand (static: it asks /v1/systemone itself)",
                _response("the page", {"text/html": {"schema": {"type": "string"}}}),
                {},
                open_route=True,
            )
        },
        "/playground/report": {
            "get": _operation(
                "the newest calibration report with its figures, as a page",
                _response("the page", {"text/html": {"schema": {"type": "string"}}}),
                _errors("401", oa),
            )
        },
        "/playground/report/{file}": {
            "get": {
                **_operation(
                    "a figure of a calibration report (NAME.reliability.png, NAME.coverage.png)",
                    _response(
                        "the figure",
                        {"image/png": {"schema": {"type": "string", "format": "binary"}}},
                    ),
                    _errors("401 404", oa),
                ),
                "parameters": [
                    {"name": "file", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
            }
        },
        "/v1/models/{model}": {
            "get": {
                **_operation(
                    "one name the served model answers to, as OpenAI's model object",
                    _response("the model", _json(_ref("ModelObject"))),
                    _errors("401 404 502 503 504", oa),
                ),
                "parameters": [
                    {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
            }
        },
        "/v1/completions": {
            "post": _operation(
                "passed through to llama-server",
                _response(passthrough, {**_json(free), **_EVENTS}),
                {**_errors("400 401 413 502 503 504", oa), **_RELAYED_500},
                _ref("CompletionsRequest"),
            )
        },
        "/v1/embeddings": {
            "post": _operation(
                "passed through to llama-server",
                _response(passthrough, _json(free)),
                {**_errors("400 401 413 501 502 503 504", oa), **_RELAYED_500},
                _ref("EmbeddingsRequest"),
            )
        },
        "/health": {
            "get": _operation(
                "whether llama-server is ready",
                _response("ready", _json(_ref("Health"))),
                _errors("503", oa),
                open_route=True,
            )
        },
        "/ping": {
            "get": _operation(
                "SageMaker health check",
                _response("ready: ``ok``", _TEXT),
                {"503": _response("not ready: ``loading``", _TEXT)},
                open_route=True,
            )
        },
        "/metrics": {
            "get": _operation(
                "Prometheus metrics",
                _response("the text exposition format", _TEXT),
                {},
                open_route=True,
            )
        },
        "/openapi.json": {
            "get": _operation(
                "this document",
                _response("OpenAPI 3.1", _json({"type": "object"})),
                {},
                open_route=True,
            )
        },
    }


@cache
def openapi_document() -> Schema:
    """The whole document; built on first use, then shared (treat it as read-only)."""
    schemas = _schemas()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "semif-sidecar",
            "version": __version__,
            "description": "Decisions read from llama-server's next-token scores; "
            "prompt_format_version "
            f"{', '.join(sorted(set(PROMPT_FORMAT_VERSIONS.values())))}.",
        },
        "paths": _paths(),
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }
