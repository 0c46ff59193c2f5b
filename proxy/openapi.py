"""The OpenAPI 3.1 document of every route, built once.

Request bodies of our own APIs are the pydantic models' ``model_json_schema()``
with the limits of the question builders (``decision/question.py``) laid over
the fields those models leave open (``options``, ``criteria``, ``choices``,
``levels``). Pass-through bodies (llama-server's own) and every response are
written here. Errors follow ``errors.py``: OpenAI routes answer
``{"error": {...}}``; System One answers 422 ``{"detail": [{loc, msg, type}]}``
for validation and ``{"detail": "..."}`` otherwise.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from pydantic import BaseModel

from . import __version__
from .decision.prompt import LAYOUTS, PROMPT_FORMAT_VERSION, PROMPT_FORMAT_VERSIONS
from .decision.question import MAX_LEVELS, MAX_OPTIONS, MIN_LEVELS, MIN_OPTIONS
from .protocol import decisions, systemone
from .protocol.semif import SemifSpec

__all__ = ["openapi_document"]

Schema = dict[str, Any]
_COMPONENTS = "#/components/schemas/"
_JSON = "application/json"

_UNIT = {"type": "number", "minimum": 0, "maximum": 1}
_COUNT = {"type": "integer", "minimum": 0}
_DESCRIPTION = {"type": ["string", "object", "array", "null"]}
_CHOICE_OPTIONS = {"oneOf": [
    {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True,
     "minItems": MIN_OPTIONS, "maxItems": MAX_OPTIONS},
    {"type": "object", "additionalProperties": _DESCRIPTION, "propertyNames": {"minLength": 1},
     "minProperties": MIN_OPTIONS, "maxProperties": MAX_OPTIONS},
]}
_NOUL_CRITERIA = {"type": ["object", "null"], "additionalProperties": False,
                  "properties": {"true": _DESCRIPTION, "false": _DESCRIPTION}}
_SCORE_LEVELS = {"type": "array", "minItems": MIN_LEVELS, "maxItems": MAX_LEVELS, "items": {
    "anyOf": [{"type": "string", "minLength": 1}, {"type": ["object", "array"]}]}}
_OPTIONS = {"choice": _CHOICE_OPTIONS, "noul": _NOUL_CRITERIA, "score": _SCORE_LEVELS}
_REQUIRED = {"choice": ["options"], "noul": ["type"], "score": ["type", "options"]}  # semif


def _ref(name: str) -> Schema:
    return {"$ref": _COMPONENTS + name}


def _obj(required: tuple[str, ...] = (), extra: bool | Schema = True, **props: Any) -> Schema:
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if extra is not True:
        out["additionalProperties"] = extra
    return out


def _pydantic(model: type[BaseModel], prefix: str, schemas: dict[str, Schema]) -> Schema:
    """The model's JSON Schema with its ``$defs`` moved into ``schemas`` as ``prefix + Name``."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})

    def moved(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: moved(v) for k, v in node.items()}
        if isinstance(node, list):
            return [moved(v) for v in node]
        if isinstance(node, str) and node.startswith("#/$defs/"):
            return _COMPONENTS + prefix + node.removeprefix("#/$defs/").lstrip("_")
        return node

    for name, schema in defs.items():
        schemas[prefix + name.lstrip("_")] = moved(schema)
    return moved(raw)


def _semif() -> Schema:
    """One variant per ``type``; ``choice`` is the default and needs ``options``."""
    base = SemifSpec.model_json_schema()
    variants = []
    for kind, options in _OPTIONS.items():
        variant = copy.deepcopy(base)
        props = variant["properties"]
        props["type"] = {"const": kind, "default": "choice"}
        props["options"] = options
        props["temperature"] = {"type": "number", "exclusiveMinimum": 0, "default": 1.0}
        variant["required"] = _REQUIRED[kind]
        variant["title"] = f"Semif{kind.title()}"
        variants.append(variant)
    return {"oneOf": variants}


# a relayed generation's length (proxy/protocol/relayed.py)
_RELAY_TOKENS = {"type": "integer", "minimum": 0, "description": (
    "at most the proxy's --relay-max-tokens (2048 by default; 400 above), which is inserted "
    "when the request names no length")}


def _request_schemas(schemas: dict[str, Schema]) -> None:
    schemas["Semif"] = _semif()
    text_part = _obj(("type", "text"), type={"const": "text"}, text={"type": "string"})
    tool_call = _obj(("type", "function"), type={"const": "function"}, id={"type": "string"},
                     function=_obj(("name", "arguments"), name={"type": "string"},
                                   arguments={"type": "string"}))
    schemas["Message"] = _obj(("role",), role={"type": "string"}, content={
        "anyOf": [{"type": ["string", "null"]}, {"type": "array", "items": text_part}]},
        tool_calls={"type": "array", "items": tool_call})
    # llama-server's rule: content, or tool calls in an assistant message
    schemas["Message"]["anyOf"] = [{"required": ["content"]}, {
        "required": ["tool_calls"], "properties": {"role": {"const": "assistant"}}}]
    schemas["ChatDecisionRequest"] = _obj(
        ("messages", "semif"),
        messages={"type": "array", "minItems": 1, "items": _ref("Message")},
        semif=_ref("Semif"),
        model={"description": "echoed in the answer when it is a string"},
        stream={"type": "boolean", "description": "the whole answer as one chunk, then [DONE]"},
        n={"enum": [1, None]},
        tools={"type": ["array", "null"], "maxItems": 0},
        response_format={"type": "null"},
        chat_template_kwargs={"type": ["object", "null"]},
    )
    schemas["ChatPassThroughRequest"] = _obj(
        ("messages",), semif={"type": "null"},
        messages={"type": "array", "minItems": 1, "items": _ref("Message")},
        max_tokens=_RELAY_TOKENS, stream={"type": "boolean"},
    )
    schemas["ChatRequest"] = {
        "oneOf": [_ref("ChatDecisionRequest"), _ref("ChatPassThroughRequest")]}
    # The request models are private to their protocol modules; their schemas are public here.
    schemas["SystemOneRequest"] = s1 = _pydantic(systemone._Request, "SystemOne", schemas)
    s1["properties"]["state"] = {"type": ["string", "object", "array"]}
    for kind, criteria in _OPTIONS.items():
        schemas[f"SystemOne{kind.title()}"]["properties"]["criteria"] = criteria
    schemas["DecisionsRequest"] = _pydantic(decisions._Request, "Decisions", schemas)
    schemas["DecisionsImage"]["description"] = "refused (400): this server reads text only"
    document = {"anyOf": [{"type": "string"}, _obj(("text",), text={"type": "string"})]}
    schemas["RerankRequest"] = _obj(
        ("query", "documents"), query={"type": "string", "minLength": 1},
        documents={"type": "array", "minItems": 1, "items": document},
        top_n={"type": ["integer", "null"], "minimum": 1},
        return_documents={"type": "boolean"}, model={"type": ["string", "null"]},
        x_method={"enum": ["pointwise", "listwise"], "description": (
            "pointwise (default): P(yes) of a yes/no question per document, the query read "
            "once; listwise: one choice over all documents (2 to 255), scores summing to 1")},
        x_calibration={"type": ["string", "null"],
                       "description": "a calibration profile for pointwise scores"})
    schemas["DecisionsChoice"]["properties"]["choices"].update(
        minItems=MIN_OPTIONS, maxItems=MAX_OPTIONS)
    schemas["DecisionsScore"]["properties"]["levels"].update(
        minItems=MIN_LEVELS, maxItems=MAX_LEVELS)


def _answers(schemas: dict[str, Schema]) -> None:
    probs = {"type": "object", "additionalProperties": _UNIT}
    core = {
        "choice": _obj(("type", "choice", "probabilities", "confidence"), type={"const": "choice"},
                       choice={"type": "string"}, probabilities=probs, confidence=_UNIT),
        "score": _obj(("type", "score", "legend", "probabilities", "confidence"),
                      type={"const": "score"}, score={"type": "number", "minimum": 0},
                      legend={"type": "object"}, probabilities=probs, confidence=_UNIT),
        "noul": _obj(("type", "noul"), type={"const": "noul"}, noul=_UNIT),
    }
    facts = {"label_mass": {"type": "number", "minimum": 0},
             "reads": {"type": "integer", "minimum": 1},
             "prompt_format_version": {"const": PROMPT_FORMAT_VERSION}}
    chat_facts = {**facts, "prompt_format_version": {"enum": sorted(
        set(PROMPT_FORMAT_VERSIONS.values()))}}
    labels = {"type": "object", "additionalProperties": {"type": "string"}}
    chat, s1 = [], []
    for kind, answer in core.items():
        c, s = copy.deepcopy(answer), copy.deepcopy(answer)
        c["properties"].update(chat_facts, labels=labels, layout={"enum": list(LAYOUTS)},
                               read_scheme={"type": "string"}, repeatable={"type": "boolean"})
        c["required"] += [*facts, "labels"] + (["probabilities"] if kind == "noul" else [])
        if kind == "noul":
            c["properties"]["probabilities"] = probs
        s["properties"].update({f"x_{k}": v for k, v in facts.items()},
                               x_read_scheme={"type": "string"},
                               x_repeatable={"type": "boolean"})
        s["required"] += [f"x_{k}" for k in facts]
        chat.append(c)
        s1.append(s)
    schemas["SemifAnswer"] = {"oneOf": chat}
    schemas["SystemOneAnswer"] = {"oneOf": s1}


def _response_schemas(schemas: dict[str, Schema]) -> None:
    _answers(schemas)
    schemas["ChatCompletion"] = _obj(
        ("object", "choices"), id={"type": "string"}, object={"const": "chat.completion"},
        created={"type": "integer"}, model={"type": "string"}, usage={"type": "object"},
        choices={"type": "array", "items": _obj(
            ("index",), index=_COUNT, message={"type": "object"},
            finish_reason={"type": ["string", "null"]})},
        semif=_ref("SemifAnswer"),
    )
    schemas["SystemOneResponse"] = _obj(
        ("model", "answers", "usage"), model={"type": "string"},
        answers={"type": "object", "additionalProperties": _ref("SystemOneAnswer")},
        usage=_obj(("input_tokens", "output_tokens"), input_tokens=_COUNT, output_tokens=_COUNT),
    )
    name = {"type": ["string", "null"]}
    value = {"type": ["string", "boolean"]}
    schemas["DecisionsAnswer"] = {"oneOf": [
        _obj(("type", "name", "probability"), type={"const": "predicate"}, name=name,
             probability=_UNIT),
        _obj(("type", "name", "choice", "confidence", "probabilities"), type={"const": "choice"},
             name=name, choice=value, confidence=_UNIT, probabilities={
                 "type": "array",
                 "items": _obj(("value", "probability"), value=value, probability=_UNIT)}),
        _obj(("type", "name", "score", "confidence", "probabilities"), type={"const": "score"},
             name=name, score={"type": "number", "minimum": 0}, confidence=_UNIT,
             probabilities={"type": "array", "items": _obj(
                 ("label", "value", "probability"), label={"type": "string"}, value=_COUNT,
                 probability=_UNIT)}),
    ]}
    schemas["DecisionsResponse"] = _obj(
        ("model", "answers", "usage"), model={"type": "string"},
        answers={"type": "array", "items": _ref("DecisionsAnswer")},
        usage=_obj(("input_tokens", "output_tokens", "total_tokens"), input_tokens=_COUNT,
                   output_tokens=_COUNT, total_tokens=_COUNT),
    )
    schemas["RerankResponse"] = _obj(
        ("model", "object", "results", "usage"), id={"type": "string"},
        model={"type": "string"}, object={"const": "list"},
        results={"type": "array", "items": _obj(
            ("index", "relevance_score"), index=_COUNT, relevance_score={
                "type": "number", "description": "0 to 1 when read here; a reranker model's "
                "raw score when forwarded to one"},
            document=_obj(("text",), text={"type": "string"}))},
        usage=_obj(("prompt_tokens", "total_tokens"), prompt_tokens=_COUNT,
                   total_tokens=_COUNT),
        x_method={"enum": ["pointwise", "listwise"]}, x_evaluated_tokens=_COUNT)
    schemas["Models"] = _obj(
        ("data", "models"), object={"const": "list"},
        x_llama_build={"type": "string", "description": "llama-server's build (/props build_info)"},
        data={"type": "array", "items": _obj(("id",), id={"type": "string"})},
        models={"type": "array", "items": _obj(
            ("name", "description", "release_date"), name={"type": "string"},
            description={"type": "string"}, release_date={"type": "string", "format": "date"})},
    )
    schemas["OpenAIError"] = _obj(("error",), error=_obj(
        ("message", "type"), message={"type": "string"}, type={"type": "string"},
        param={"type": ["string", "null"]}, code={"type": ["string", "integer", "null"]}))
    schemas["ValidationError"] = _obj(("detail",), detail={
        "type": "array", "minItems": 1, "items": _obj(
            ("loc", "msg", "type"), loc={"type": "array", "items": {"type": ["string", "integer"]}},
            msg={"type": "string"}, type={"type": "string"})})
    schemas["DetailError"] = _obj(("detail",), detail={"type": "string"})


def _json(schema: Schema) -> dict[str, Schema]:
    return {_JSON: {"schema": schema}}


def _response(description: str, content: dict[str, Schema] | None = None,
              retry_after: bool = False) -> Schema:
    out: Schema = {"description": description}
    if content:
        out["content"] = content
    if retry_after:
        out["headers"] = {"Retry-After": {"required": True, "schema": {"type": "string"},
                                          "description": "seconds to wait before retrying"}}
    return out


# OpenAPI 3.1: the schema of a text/event-stream describes each event.
_EVENTS = {"text/event-stream": {"schema": _obj(("data",), data={"type": "string"})}}
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
_RELAYED_500 = {"500": _response("pass-through only: llama-server's own error, relayed unchanged",
                                 _json({"type": "object"}))}


def _errors(codes: str, shape: Schema) -> dict[str, Schema]:
    return {c: _response(_WHY[c], _json(shape), retry_after=c in ("429", "503"))
            for c in codes.split()}


def _operation(summary: str, ok: Schema, errors: dict[str, Schema],
               body: Schema | None = None, open_route: bool = False) -> Schema:
    op: Schema = {"summary": summary, "responses": {"200": ok, **errors}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": _json(body)}
    if open_route:
        op["security"] = []
    return op


_LINES = {"application/jsonlines": {"schema": {
    "type": "string", "description": "one JSON answer (or error record) per line, in order"}}}


def _jsonlines(op: Schema) -> Schema:
    """The operation also taking an application/jsonlines body."""
    op["requestBody"]["content"].update(_LINES)
    return op


def _paths() -> dict[str, Schema]:
    oa, detail, invalid = _ref("OpenAIError"), _ref("DetailError"), _ref("ValidationError")
    either = {"anyOf": [oa, detail]}
    answer = {"anyOf": [_ref(name) for name in
                        ("ChatCompletion", "SystemOneResponse", "DecisionsResponse")]}
    passthrough = "llama-server's answer, unchanged"
    status = _obj(("status",), status={"type": "string"})
    return {
        "/v1/chat/completions": {"post": _operation(
            "OpenAI chat completions; with ``semif`` answered as a decision, otherwise passed "
            "through to llama-server (streaming too)",
            _response("a chat.completion (with ``semif``) or one chunk and [DONE] when streaming",
                      {**_json(_ref("ChatCompletion")), **_EVENTS}),
            {**_errors("400 401 413 429 502 503 504", oa), **_RELAYED_500}, _ref("ChatRequest"))},
        "/v1/systemone": {"post": _operation(
            "System One: questions about one state, answered from the served chat model",
            _response("one answer per question id", _json(_ref("SystemOneResponse"))),
            {**_errors("422", invalid), **_errors("400 401 413 429 502 503 504", detail)},
            _ref("SystemOneRequest"))},
        "/v1/decisions": {"post": _operation(
            "OpenAI Decisions: questions about one input, answered in order",
            _response("a Decision", _json(_ref("DecisionsResponse"))),
            _errors("400 401 413 429 502 503 504", oa), _ref("DecisionsRequest"))},
        **{path: {"post": _operation(
            "Rerank: documents ordered by relevance to a query, read from the served chat "
            "model (forwarded untouched to a llama-server started with --reranking)",
            _response("the documents' scores, best first (top_n of them)",
                      _json(_ref("RerankResponse"))),
            _errors("400 401 413 429 502 503 504", oa), _ref("RerankRequest"))}
           for path in ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking", "/v2/rerank")},
        "/invocations": {"post": _jsonlines(_operation(
            "SageMaker: any body of the three routes above, told apart by its fields; "
            "application/jsonlines: one such decision request per line (Batch Transform), "
            "answered line for line",
            _response("the answer of the route the body belongs to",
                      {**_json(answer), **_EVENTS, **_LINES}),
            {**_errors("401 413", oa), **_errors("422", invalid),
             **_errors("400 429 502 503 504", either), **_RELAYED_500},
            {"anyOf": [_ref("ChatRequest"), _ref("SystemOneRequest"), _ref("DecisionsRequest")]}))},
        "/livez": {"get": _operation(
            "liveness of the proxy process alone (never asks llama-server)",
            _response("alive", _json(_obj(("status",), status={"const": "alive"}))), {},
            open_route=True)},
        "/execution-parameters": {"get": _operation(
            "SageMaker Batch Transform: how to call /invocations (application/jsonlines, one "
            "decision request per line, answered line for line)",
            _response("the parameters", _json(_obj(
                ("MaxConcurrentTransforms", "BatchStrategy", "MaxPayloadInMB"),
                MaxConcurrentTransforms=_COUNT, BatchStrategy={"const": "MULTI_RECORD"},
                MaxPayloadInMB=_COUNT))), _errors("401", oa))},
        "/v1/models": {"get": _operation(
            "llama-server's model list plus the System One names this server answers to",
            _response("the models", _json(_ref("Models"))), _errors("401 502 503 504", oa))},
        "/playground": {"get": _operation(
            "a page to try decisions by hand (static: it asks /v1/systemone itself)",
            _response("the page", {"text/html": {"schema": {"type": "string"}}}), {},
            open_route=True)},
        "/playground/report": {"get": _operation(
            "the newest calibration report with its figures, as a page",
            _response("the page", {"text/html": {"schema": {"type": "string"}}}),
            _errors("401", oa))},
        "/playground/report/{file}": {"get": {
            **_operation("a figure of a calibration report (NAME.reliability.png, "
                         "NAME.coverage.png)",
                         _response("the figure", {"image/png": {"schema": {
                             "type": "string", "format": "binary"}}}),
                         _errors("401 404", oa)),
            "parameters": [{"name": "file", "in": "path", "required": True,
                            "schema": {"type": "string"}}]}},
        "/v1/models/{model}": {"get": {
            **_operation("one name the served model answers to, as OpenAI's model object",
                         _response("the model", _json(_obj(
                             ("id", "object"), id={"type": "string"},
                             object={"const": "model"}, created=_COUNT,
                             owned_by={"type": "string"}))),
                         _errors("401 404 502 503 504", oa)),
            "parameters": [{"name": "model", "in": "path", "required": True,
                            "schema": {"type": "string"}}]}},
        "/v1/completions": {"post": _operation(
            "passed through to llama-server", _response(passthrough, {**_json({"type": "object"}),
                                                                      **_EVENTS}),
            {**_errors("400 401 413 502 503 504", oa), **_RELAYED_500},
            _obj(("prompt",), prompt={"type": ["string", "array"]}, max_tokens=_RELAY_TOKENS,
                 stream={"type": "boolean"}))},
        "/v1/embeddings": {"post": _operation(
            "passed through to llama-server", _response(passthrough, _json({"type": "object"})),
            {**_errors("400 401 413 501 502 503 504", oa), **_RELAYED_500},
            _obj(("input",), input={"type": ["string", "array"]}))},
        "/health": {"get": _operation(
            "whether llama-server is ready", _response("ready", _json(status)),
            {"503": _response("llama-server is not ready", _json(status))}, open_route=True)},
        "/ping": {"get": _operation(
            "SageMaker health check", _response("ready: ``ok``", _TEXT),
            {"503": _response("not ready: ``loading``", _TEXT)}, open_route=True)},
        "/metrics": {"get": _operation(
            "Prometheus metrics", _response("the text exposition format", _TEXT), {},
            open_route=True)},
        "/openapi.json": {"get": _operation(
            "this document", _response("OpenAPI 3.1", _json({"type": "object"})), {},
            open_route=True)},
    }


@cache
def openapi_document() -> Schema:
    """The whole document; built on first use, then shared (treat it as read-only)."""
    schemas: dict[str, Schema] = {}
    _request_schemas(schemas)
    _response_schemas(schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "semif-sidecar", "version": __version__,
                 "description": "Decisions read from llama-server's next-token scores; "
                                "prompt_format_version "
                                f"{', '.join(sorted(set(PROMPT_FORMAT_VERSIONS.values())))}."},
        "paths": _paths(),
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }
