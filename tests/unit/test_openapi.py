"""The OpenAPI document: valid OpenAPI 3.1, one operation per route of the app, and its
schemas (pydantic models of protocol/) held to what the code accepts and answers."""

from __future__ import annotations

import math
import typing
from typing import Any

import jsonschema
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import BaseModel
from referencing import Registry, Resource
from schemathesis.specs.openapi.definitions import OPENAPI_31

from proxy.app import create_app
from proxy.calibration.profile import ROUTE_REASONS
from proxy.config import Settings
from proxy.decision.outcome import Outcome
from proxy.decision.prompt import (
    DEFAULT_LAYOUT,
    LAYOUTS,
    PROMPT_FORMAT_VERSION,
    PROMPT_FORMAT_VERSIONS,
)
from proxy.decision.question import choice_question, noul_question, score_question
from proxy.decision.readout import decide
from proxy.errors import (
    InternalError,
    InvalidRequest,
    Overloaded,
    ProfileRefused,
    Unprocessable,
    UpstreamUnavailable,
    error_record,
    openai_error,
    system_one_error,
)
from proxy.openapi import REQUESTS, RESPONSES, openapi_document
from proxy.protocol import chat, decisions, rerank, systemone
from proxy.protocol.error_bodies import DetailError, ErrorRecord, OpenAIError, ValidationError
from proxy.protocol.meta import Alive, ExecutionParameters, Health, ModelList, ModelObject
from proxy.protocol.records import RouteReason
from proxy.protocol.semif import (
    SemifSpec,
    parse_chat,
)
from proxy.protocol.wire import Layout, PromptFormat

DOC = openapi_document()
SCHEMAS = DOC["components"]["schemas"]
_REGISTRY = Registry().with_resource("urn:doc", Resource.opaque(DOC))


def _valid(name: str, body: Any) -> None:
    """``body`` (as JSON) is valid in the document's schema ``name``."""
    schema = {"$ref": f"urn:doc#/components/schemas/{name}"}
    jsonschema.Draft202012Validator(schema, registry=_REGISTRY).validate(
        orjson.loads(orjson.dumps(body))
    )


def _answers(model: type[BaseModel], body: dict[str, Any]) -> None:
    """``body`` is valid in ``model``'s schema and holds nothing the model does not name."""
    data = orjson.loads(orjson.dumps(body))
    _valid(model.__name__, data)
    assert model.model_validate(data).model_dump(mode="json", exclude_unset=True) == data


def _referenced(node: Any) -> set[str]:
    if isinstance(node, dict):
        here = {node["$ref"].rsplit("/", 1)[-1]} if "$ref" in node else set()
        return here.union(*(_referenced(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_referenced(v) for v in node))
    return set()


def test_the_document_is_openapi_3_1_and_every_reference_resolves():
    jsonschema.Draft202012Validator(OPENAPI_31).validate(DOC)
    for schema in SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    assert _referenced(DOC) <= set(SCHEMAS)
    assert not any(name.startswith("_") or "__" in name for name in SCHEMAS)


def test_the_document_names_every_route():
    app = create_app(Settings())
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    documented = {(m.upper(), p) for p, ops in DOC["paths"].items() for m in ops}
    # the catch-all (relayed, which OpenAPI cannot name) is documented by its two OpenAI routes
    relayed = {("POST", "/v1/completions"), ("POST", "/v1/embeddings")}
    assert ("*", "/{path}") in routes
    assert documented == (routes - {("*", "/{path}")}) | relayed


async def test_the_route_serves_the_document():
    async with TestClient(TestServer(create_app(Settings()))) as client:
        resp = await client.get("/openapi.json")
        assert resp.status == 200 and resp.content_type == "application/json"
        assert await resp.json() == DOC


def test_every_model_is_a_component_and_models_type_their_fields():
    assert {m.__name__ for m in (*REQUESTS, *RESPONSES)} <= set(SCHEMAS)
    for model in (*REQUESTS, *RESPONSES):
        for name, field in model.model_fields.items():
            assert field.annotation is not Any, f"{model.__name__}.{name}"


def test_the_literals_follow_the_constants_they_echo():
    assert set(typing.get_args(PromptFormat)) == set(PROMPT_FORMAT_VERSIONS.values())
    assert typing.get_args(Layout) == LAYOUTS
    assert typing.get_args(RouteReason) == ROUTE_REASONS
    assert PROMPT_FORMAT_VERSION == "semif-1"  # System One's and rerank's Literal
    assert SemifSpec.model_fields["layout"].default == DEFAULT_LAYOUT


MESSAGES = [{"role": "user", "content": "Ticket: where is my parcel?"}]
# bodies the code accepts (the protocol unit tests' valid cases), valid in the document
ACCEPTED = [
    ("ChatDecisionRequest", {"messages": MESSAGES, "semif": {"options": ["a", "b"]}}),
    (
        "ChatDecisionRequest",
        {
            "messages": MESSAGES,
            "model": 7,
            "n": 1,
            "tools": [],
            "response_format": None,
            "logprobs": True,
            "top_logprobs": 20,
            "stream": True,
            "stream_options": {"include_usage": True},
            "semif": {
                "options": {"🚚 ship": None, "bill": "money"},
                "temperature": 2,
                "debias": "cyclic",
                "calibration": "p",
                "label_mass_floor": 0.3,
                "layout": "options_first",
            },
        },
    ),
    ("ChatDecisionRequest", {"messages": MESSAGES, "semif": {"type": "noul"}}),
    (
        "ChatDecisionRequest",
        {
            "messages": MESSAGES,
            "semif": {"type": "noul", "options": {"true": "spam"}, "debias": {"method": "cyclic"}},
        },
    ),
    (
        "ChatDecisionRequest",
        {
            "messages": MESSAGES,
            "semif": {
                "type": "score",
                "options": ["low", {"level": "high"}],
                "temperature": 5e-324,
            },
        },
    ),
    (
        "ChatDecisionRequest",
        {
            "semif": {"options": ["a", "b"]},
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
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
            ],
        },
    ),
    ("ChatPassThroughRequest", {"messages": MESSAGES, "max_tokens": 4, "stream": True}),
    ("ChatPassThroughRequest", {"messages": MESSAGES, "semif": None, "max_tokens": None}),
    (
        "SystemOneRequest",
        {
            "model": "jev-latest",
            "state": {"subject": "Duplicate charge"},
            "unknown": 1,
            "x_debias": {"method": "cyclic", "rotations": 2},
            "x_calibration": "p",
            "x_label_mass_floor": 0.5,
            "questions": {
                "route": {
                    "type": "choice",
                    "instructions": {"task": "route"},
                    "criteria": {" Billing ": ["money"], "🚚 shipping": None},
                },
                "urgency": {"type": "score", "criteria": ["low", {"level": "high"}]},
                "spam": {"type": "noul", "criteria": {"true": "advertising"}},
                "plain": {"type": "noul", "criteria": None},
            },
        },
    ),
    (
        "SystemOneRequest",
        {
            "state": ["a"],
            "x_debias": "pride",
            "questions": {"c": {"type": "choice", "criteria": ["a", "b"]}},
        },
    ),
    (
        "DecisionsRequest",
        {
            "model": "m",
            "input": "parcel",
            "questions": [
                {"type": "predicate", "instructions": "Is it about shipping?"},
                {
                    "type": "choice",
                    "name": "team",
                    "instructions": [{"type": "input_text", "text": "Which team?"}],
                    "choices": [{"value": "billing", "description": "money"}, {"value": True}],
                },
                {
                    "type": "score",
                    "instructions": "How urgent?",
                    "levels": [{"label": "low"}, {"label": "high"}],
                },
            ],
        },
    ),
    (
        "DecisionsRequest",
        {
            "model": "m",
            "prompt_cache_key": "k",
            "input": [
                {"role": "user", "content": [{"type": "input_json", "data": {"a": [1]}}]},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "ok"},
            ],
            "questions": [{"type": "predicate", "instructions": "Done?"}],
        },
    ),
    (
        "RerankRequest",
        {
            "query": "q",
            "documents": ["a", {"text": "b", "id": 3}],
            "top_n": 1,
            "return_documents": True,
            "model": None,
            "x_method": "listwise",
        },
    ),
    ("CompletionsRequest", {"prompt": "Once upon", "max_tokens": 4, "stream": True}),
    ("EmbeddingsRequest", {"input": ["a", "b"]}),
]


@pytest.mark.parametrize(("name", "body"), ACCEPTED)
def test_bodies_the_code_accepts_are_valid_in_the_document(name, body):
    if name == "ChatDecisionRequest":
        parse_chat(body)
    elif name == "SystemOneRequest":
        systemone.parse_request(body)
    elif name == "DecisionsRequest":
        decisions.parse_request(body)
    elif name == "RerankRequest":
        rerank.parse_request(body, max_documents=10, max_document_chars=100)
    _valid(name, body)
    if name.startswith("Chat"):
        _valid("ChatRequest", body)


def _outcome(question, probs, **extra) -> Outcome:
    logprobs = [math.log(p) if p > 0 else -800.0 for p in probs]
    return Outcome(
        decide(question, logprobs), tuple("ABCDEFG"[: len(probs)]), "m", 12, 10, 1, **extra
    )


CHOICE = choice_question({"billing": None, "shipping": "parcels"})
SCORE = score_question(["low", {"level": "high"}, ["x"]])
NOUL = noul_question(None)
READ_DETAILS = {
    "calibration": {"profile": "p", "method": "temperature"},
    "route": "review",
    "route_reason": "below_threshold",
    "debias": "cyclic",
    "debias_note": "why",
    "rotations": ((0, (0.4, 0.6)), (1, (0.5, 0.5))),
    "read_scheme": "prefix-63",
    "repeatable": True,
    "input_tokens": 30,
}
OUTCOMES = [
    _outcome(CHOICE, [0.3, 0.7]),
    _outcome(CHOICE, [0.3, 0.7], layout="options_first", **READ_DETAILS),
    _outcome(SCORE, [0.2, 0.5, 0.3], **READ_DETAILS),
    _outcome(NOUL, [0.9, 0.1]),
    _outcome(NOUL, [0.0, 1.0], **READ_DETAILS),
]


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("top", [None, 0, 2])
def test_chat_decisions_answer_as_documented(outcome, top):
    _answers(chat.ChatCompletion, chat.completion_body(outcome, None, top))
    for include_usage in (False, True):
        for chunk in chat.completion_chunks(outcome, "named", top, include_usage):
            _answers(chat.ChatCompletionChunk, chunk)


def test_system_one_answers_as_documented():
    body = systemone.response_body("jev-latest", dict(zip("abcde", OUTCOMES)))
    _answers(systemone.SystemOneResponse, body)


def test_decisions_answer_as_documented():
    call = decisions.parse_request(
        {
            "model": "m",
            "input": "parcel",
            "questions": [
                {"type": "predicate", "instructions": "Shipping?"},
                {
                    "type": "choice",
                    "instructions": "Team?",
                    "name": "team",
                    "choices": [{"value": "billing"}, {"value": True}],
                },
                {
                    "type": "score",
                    "instructions": "Urgency?",
                    "levels": [{"label": "low"}, {"label": "mid"}, {"label": "high"}],
                },
            ],
        }
    )
    outcomes = {
        "0": OUTCOMES[3],
        "1": _outcome(call.asked[1].question, [0.4, 0.6]),
        "2": _outcome(call.asked[2].question, [0.2, 0.5, 0.3]),
    }
    _answers(decisions.DecisionsResponse, decisions.response_body(call, outcomes))


@pytest.mark.parametrize("method", ["pointwise", "listwise"])
@pytest.mark.parametrize("give", [False, True])
def test_rerank_answers_as_documented(method, give):
    call = rerank.parse_request(
        {
            "query": "q",
            "documents": ["a", "b", "c"],
            "top_n": 2,
            "x_method": method,
            "return_documents": give,
        },
        max_documents=10,
        max_document_chars=100,
    )
    if method == "listwise":
        outcomes = {"0": _outcome(rerank.listwise_question(call), [0.2, 0.5, 0.3])}
    else:
        outcomes = {
            qid: _outcome(q, [0.6, 0.4], **READ_DETAILS)
            for qid, q in rerank.pointwise_questions(call).items()
        }
    body = rerank.response_body(call, rerank.relevance(call, outcomes), outcomes, "m")
    _answers(rerank.RerankResponse, body)


@pytest.mark.parametrize(
    "err",
    [
        InvalidRequest("bad", param="semif.options"),
        Overloaded("busy"),
        UpstreamUnavailable("down"),
        ProfileRefused("no profile named p", param="x_calibration"),
        InternalError("0123456789abcdef"),
        Unprocessable([{"loc": ["body", "state"], "msg": "m", "type": "missing"}]),
    ],
)
def test_error_bodies_are_documented(err):
    _answers(OpenAIError, openai_error(err).body)
    _answers(ErrorRecord, error_record(err))
    reply = system_one_error(err)
    _answers(ValidationError if reply.status == 422 else DetailError, reply.body)


# A recorded llama-server: one model, ready.
_MODELS = {
    "object": "list",
    "models": [{"name": "smollm2", "model": "smollm2"}],
    "data": [
        {
            "id": "smollm2",
            "object": "model",
            "created": 1735689600,
            "owned_by": "llamacpp",
            "meta": {"n_ctx_train": 8192},
        }
    ],
}


def _recorded() -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response(_MODELS)

    async def props(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "total_slots": 1,
                "build_info": "b11434",
                "model_path": "/models/smollm2.gguf",
                "default_generation_settings": {"n_ctx": 4096},
            }
        )

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/props", props)
    app.router.add_get("/health", health)
    return app


async def test_the_routes_own_answers_are_documented():
    async with TestServer(_recorded()) as upstream:
        settings = Settings(upstream_url=str(upstream.make_url("")).rstrip("/"))
        async with TestClient(TestServer(create_app(settings))) as client:
            for path, model in [
                ("/v1/models", ModelList),
                ("/v1/models/jev-latest", ModelObject),
                ("/health", Health),
                ("/livez", Alive),
            ]:
                resp = await client.get(path)
                assert resp.status == 200, await resp.text()
                _valid(model.__name__, await resp.json())
            resp = await client.get("/v1/models/nothing-by-this-name")
            assert resp.status == 404
            _answers(OpenAIError, await resp.json())
            resp = await client.get("/execution-parameters")
            _answers(ExecutionParameters, await resp.json())


def _with_records(outcomes, api, *, question_ids=True, inputs=True):
    """Each outcome's decision id and record (proxy/recorder.py), inputs included."""
    from proxy.recorder import Context, decision_ids, records_of
    from proxy.service import Asked

    questions = {qid: o.decision.question for qid, o in outcomes.items()}
    state = "a parcel" if question_ids else None
    asked = (
        Asked.about_state(state, questions)
        if state
        else Asked([{"role": "user", "content": "hi"}], questions)
    )
    context = Context("r1", api, 1.0, state=state, question_ids=question_ids)
    ids = decision_ids("r1", list(outcomes))
    raw = {qid: o.decision.probabilities for qid, o in outcomes.items()}
    records = records_of(
        context,
        asked,
        outcomes,
        raw,
        ids,
        threshold=0.5,
        llama_build="b1",
        answered_at=0.0,
        finished=1.5,
        key=b"k" * 16,
        inputs=inputs,
    )
    return ids, {qid: record.dump() for qid, record in records.items()}


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("inputs", [False, True])
def test_answers_with_decision_ids_and_records_are_documented(outcome, inputs):
    ids, records = _with_records({"0": outcome}, "chat", question_ids=False, inputs=inputs)
    body = chat.completion_body(outcome, None, None, ids["0"], records["0"])
    assert body["semif"]["decision_id"] == "r1"
    _answers(chat.ChatCompletion, body)
    for chunk in chat.completion_chunks(outcome, "m", 2, True, ids["0"], records["0"]):
        _answers(chat.ChatCompletionChunk, chunk)
    several = dict(zip("abcde", OUTCOMES))
    ids, records = _with_records(several, "system_one", inputs=inputs)
    body = systemone.response_body("jev-latest", several, ids, records)
    assert body["answers"]["b"]["x_decision_id"] == "r1/b"
    _answers(systemone.SystemOneResponse, body)


def test_decisions_and_rerank_with_decision_ids_and_records_are_documented():
    call = decisions.parse_request(
        {"model": "m", "input": "parcel", "questions": [{"type": "predicate", "instructions": "?"}]}
    )
    outcomes = {"0": OUTCOMES[3]}
    ids, records = _with_records(outcomes, "decisions")
    body = decisions.response_body(call, outcomes, ids, records)
    assert body["answers"][0]["x_decision_id"] == "r1"
    _answers(decisions.DecisionsResponse, body)
    for method in ("pointwise", "listwise"):
        call = rerank.parse_request(
            {"query": "q", "documents": ["a", "b", "c"], "top_n": 2, "x_method": method},
            max_documents=10,
            max_document_chars=100,
        )
        if method == "listwise":
            outcomes = {"0": _outcome(rerank.listwise_question(call), [0.2, 0.5, 0.3])}
        else:
            outcomes = {
                qid: _outcome(q, [0.6, 0.4]) for qid, q in rerank.pointwise_questions(call).items()
            }
        ids, records = _with_records(outcomes, "rerank", question_ids=method == "pointwise")
        scores = rerank.relevance(call, outcomes)
        body = rerank.response_body(call, scores, outcomes, "m", ids, records)
        assert len(body["x_records"]) == len(outcomes)  # top_n leaves none out
        expected = {0: "r1/0", 1: "r1/1", 2: "r1/2"} if method == "pointwise" else None
        for result in body["results"]:
            want = expected[result["index"]] if expected else "r1"
            assert result["x_decision_id"] == want
        _answers(rerank.RerankResponse, body)
