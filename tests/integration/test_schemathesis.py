"""Schemathesis against the live proxy's ``/openapi.json``: bad input never gets a
500, every answer matches the document, every status is one the document lists.

Each route is fuzzed with schema-valid bodies (positive) and with schema-invalid
ones (negative), which must get a documented 4xx. Positive cases come from a copy
of the document narrowed by ``_bounded`` so a run fits in a few minutes on 2
cores: at most 4 options, levels or questions, and the served model's name.
Negative cases come from the document as published (a narrowed limit would make
valid input look invalid). ``EXPLICIT`` bodies (streams, score, System One over
the context...) are held to the same document.

Relayed generations (chat without ``semif``, ``/v1/completions``) name any
``max_tokens`` or none: the proxy here caps them at ``MAX_GENERATED`` tokens
(``--relay-max-tokens``), inserting the cap or refusing more with a 400, and
checks chat bodies down to the content parts, so a relayed body never gets a 5xx
(llama-server's 500 for a part it cannot parse, its slots held by a long
generation, as the first runs found). ``REFUSALS`` pin what fuzzing first found
(F2, F3, F5): message parts a decision read cannot lay out, a subnormal
temperature, and ``n``/``tools`` of the wrong type get a 400 naming the field, or
an answer.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.definitions import OPENAPI_31

from proxy.app import create_app
from proxy.config import Settings
from proxy.openapi import openapi_document
from scripts.stack import stop
from tests.conftest import LlamaServer, launch_proxy

POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
MODEL = "jev-latest"  # the System One alias every served model answers to
MAX_GENERATED = 16  # tokens a relayed generation may produce here (--relay-max-tokens)
MAX_LIST = 4  # options, levels, questions per generated positive body
UPSTREAM_STATUSES = {502, 503, 504}
CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

# (method, path, mode, examples): about 40 s on 2 cores with the default model. Refusals
# take milliseconds, so negative cases are many; positive ones each read the model.
PLAN = [
    ("POST", "/v1/chat/completions", POSITIVE, 25),
    ("POST", "/v1/chat/completions", NEGATIVE, 100),
    ("POST", "/v1/systemone", POSITIVE, 25),
    ("POST", "/v1/systemone", NEGATIVE, 100),
    ("POST", "/v1/decisions", POSITIVE, 25),
    ("POST", "/v1/decisions", NEGATIVE, 100),
    ("POST", "/v1/rerank", POSITIVE, 15),
    ("POST", "/v1/rerank", NEGATIVE, 60),
    ("POST", "/invocations", POSITIVE, 20),
    ("POST", "/invocations", NEGATIVE, 100),
    ("POST", "/v1/completions", POSITIVE, 25),
    ("POST", "/v1/completions", NEGATIVE, 40),
    ("POST", "/v1/embeddings", POSITIVE, 5),
    ("GET", "/v1/models", POSITIVE, 2),
    ("GET", "/health", POSITIVE, 2),
    ("GET", "/ping", POSITIVE, 2),
    ("GET", "/metrics", POSITIVE, 2),
    ("GET", "/openapi.json", POSITIVE, 2),
]
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


def _bounded(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of the document whose valid bodies are small (short strings, flat
    free-form values, at most MAX_LIST options, levels or questions) and name the
    served model. Relayed generations name no ``max_tokens`` (the cap goes in), one
    within it, or one up to twice it (refused)."""
    doc = copy.deepcopy(doc)
    schemas = doc["components"]["schemas"]
    ops = [op for path in doc["paths"].values() for op in path.values()]
    bodies = [
        m["schema"] for op in ops for m in op.get("requestBody", {}).get("content", {}).values()
    ]
    answers = [r for op in ops for r in op.get("responses", {}).values()]
    asked = _referenced(bodies, schemas)
    answered = _referenced(answers, schemas)
    # a component both sides use (free JSON values, a document) is narrowed for the
    # requests only: the answers refer to an untouched copy
    copies = {name: f"{name}Answered" for name in asked & answered}
    for name, copied in copies.items():
        schemas[copied] = copy.deepcopy(schemas[name])
    _renamed(answers + [schemas[n] for n in (answered - asked) | set(copies.values())], copies)
    for schema in bodies + [schemas[name] for name in asked]:
        _small(schema)
    schemas["SystemOneRequest"]["properties"]["model"] = {"enum": [MODEL, None]}
    schemas["DecisionsRequest"]["properties"]["model"] = {"const": MODEL}
    tokens = {"type": "integer", "minimum": 0, "maximum": 2 * MAX_GENERATED}
    schemas["ChatPassThroughRequest"]["properties"]["max_tokens"] = tokens
    schemas["CompletionsRequest"]["properties"]["max_tokens"] = tokens
    return doc


def _renamed(roots: list[Any], names: dict[str, str]) -> None:
    """Point the references in ``roots`` to the components renamed in ``names``."""
    prefix = "#/components/schemas/"
    todo = list(roots)
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith(prefix) and ref[len(prefix) :] in names:
                node["$ref"] = prefix + names[ref[len(prefix) :]]
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)


def _referenced(roots: list[Any], schemas: dict[str, Any]) -> set[str]:
    """Names of the components the given schemas refer to, directly or not."""
    names: set[str] = set()
    todo = list(roots)
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            name = ref.rsplit("/", 1)[-1]
            if ref and name not in names:
                names.add(name)
                todo.append(schemas.get(name, {}))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return names


_SCALAR = {"type": ["string", "number", "boolean", "null"], "maxLength": 40}
# a schema with none of these is free-form (any value); "required" and "properties"
# alone constrain an object (Message's anyOf branches), so they are not free-form
_COMBINED = (
    "$ref",
    "oneOf",
    "anyOf",
    "allOf",
    "not",
    "const",
    "enum",
    "type",
    "required",
    "properties",
)


def _small(schema: dict[str, Any]) -> None:
    """Narrow one schema in place: strings of at most 40 characters, lists of at
    most MAX_LIST items, free-form values flat and small."""
    for key in ("properties", "$defs"):
        for sub in schema.get(key, {}).values():
            _small(sub)
    for key in ("items", "additionalProperties", "propertyNames"):
        if isinstance(schema.get(key), dict) and schema[key]:
            _small(schema[key])
    for key in ("oneOf", "anyOf", "allOf"):
        for sub in schema.get(key, []):
            _small(sub)
    if not any(key in schema for key in _COMBINED):
        schema.update(copy.deepcopy(_SCALAR))
    types = schema.get("type", [])
    types = {types} if isinstance(types, str) else set(types)
    if "string" in types:
        schema.setdefault("maxLength", 40)
    if "object" in types and schema.get("additionalProperties", True) in (True, {}):
        schema["additionalProperties"] = copy.deepcopy(_SCALAR)
        if "properties" not in schema:
            schema.setdefault("maxProperties", 3)
    if "array" in types:
        if schema.get("items", {}) == {}:
            schema["items"] = copy.deepcopy(_SCALAR)
        schema.setdefault("maxItems", MAX_LIST)
    for key in ("maxItems", "maxProperties"):
        if key in schema:
            schema[key] = min(schema[key], MAX_LIST)


def _relayed(case: schemathesis.Case) -> bool:
    """Whether the proxy passes this body to llama-server untouched."""
    if case.path in ("/v1/completions", "/v1/embeddings"):
        return True
    body = case.body
    if not isinstance(body, dict) or body.get("semif") is not None:
        return False
    return case.path == "/v1/chat/completions" or (
        case.path == "/invocations" and "messages" in body
    )


def _semif(case: schemathesis.Case) -> dict[str, Any]:
    body = case.body if isinstance(case.body, dict) else {}
    return body.get("semif") if isinstance(body.get("semif"), dict) else {}


@pytest.fixture(scope="module")
def proxy_url(llama: LlamaServer, logs_dir) -> Iterator[str]:
    """The proxy under test, its relayed generations capped at MAX_GENERATED tokens."""
    proc, url, log = launch_proxy(logs_dir, llama.url, "--relay-max-tokens", str(MAX_GENERATED))
    yield url
    stop(proc)
    log.close()


@pytest.fixture(scope="module")
def document(proxy_url: str) -> dict[str, Any]:
    resp = httpx.get(proxy_url + "/openapi.json", timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"].startswith("application/json")
    return resp.json()


@pytest.fixture(scope="module")
def schemas(document: dict[str, Any]) -> dict[GenerationMode, schemathesis.BaseSchema]:
    return {
        POSITIVE: schemathesis.openapi.from_dict(_bounded(document)),
        NEGATIVE: schemathesis.openapi.from_dict(document),
    }


def test_document_is_openapi_3_1() -> None:
    doc = openapi_document()
    jsonschema.Draft202012Validator(OPENAPI_31).validate(doc)
    media = [
        m["schema"]
        for ops in doc["paths"].values()
        for op in ops.values()
        for part in [op.get("requestBody", {}), *op["responses"].values()]
        for m in part.get("content", {}).values()
    ]
    schemas = doc["components"]["schemas"]
    for schema in [*schemas.values(), *media]:
        jsonschema.Draft202012Validator.check_schema(schema)
    assert _referenced([*media, *schemas.values()], schemas) <= set(schemas)


def test_document_names_every_route(document: dict[str, Any]) -> None:
    app = create_app(Settings())
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    documented = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    # Every path the proxy answers is documented; of the relayed ones (the catch-all,
    # which OpenAPI cannot name), the two OpenAI routes are documented too.
    relayed = {("POST", "/v1/completions"), ("POST", "/v1/embeddings")}
    assert ("*", "/{path}") in routes
    assert documented == (routes - {("*", "/{path}")}) | relayed
    assert document == openapi_document()


@pytest.mark.parametrize(
    ("method", "path", "mode", "examples"),
    PLAN,
    ids=[f"{m} {p} {mode.value}" for m, p, mode, _ in PLAN],
)
def test_fuzz(
    schemas, proxy_url: str, method: str, path: str, mode: GenerationMode, examples: int
) -> None:
    strategy = schemas[mode][path][method].as_strategy(generation_mode=mode)

    @settings(FUZZ, max_examples=examples)
    @given(case=strategy)
    def exercise(case: schemathesis.Case) -> None:
        response = case.call(base_url=proxy_url, timeout=60)
        checks = CHECKS + ([negative_data_rejection] if mode is NEGATIVE else [])
        case.validate_response(response, checks=checks)
        status = response.status_code
        # the body sent: hypothesis's report of a failing case leaves it out
        said = f"{response.text}\nbody sent: {case.body!r}"
        if path == "/v1/embeddings":  # llama-server started without --embeddings: 501
            assert status < 500 or status == 501, said
        elif _relayed(case):  # checked and bounded by the proxy: nothing to time out
            assert status < 500, f"a relayed body got {status}: {said}"
        else:
            assert status < 500 or status in UPSTREAM_STATUSES, said
        if mode is NEGATIVE:
            assert 400 <= status < 500, f"bad input got {status}: {said}"

    exercise()


MESSAGES = [{"role": "user", "content": "Ticket: where is my parcel?"}]
SEMIF = {"options": ["billing", "shipping"]}
# Answers fuzzing reaches seldom or never, held to the same document.
EXPLICIT = {
    "semif-stream": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "semif": SEMIF, "stream": True},
    ),
    "relay-stream": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 4, "stream": True},
    ),
    "relay-stream-null": (  # null is false, as OpenAI and llama-server read it (CI found it)
        "/v1/chat/completions",
        {"messages": MESSAGES, "max_tokens": 4, "stream": None},
    ),
    "noul": ("/v1/chat/completions", {"messages": MESSAGES, "semif": {"type": "noul"}}),
    "score": (
        "/v1/chat/completions",
        {
            "messages": MESSAGES,
            "semif": {"type": "score", "options": ["low", "medium", "high"], "temperature": 0.5},
        },
    ),
    "12-options": (
        "/v1/chat/completions",
        {
            "messages": MESSAGES,
            "semif": {"options": {f"team {i}": f"handles case {i}" for i in range(12)}},
        },
    ),
    "s1-over-context": (
        "/v1/systemone",
        {"state": "word " * 40_000, "questions": {"q": {"type": "noul"}}},
    ),
    "s1-object-state": (
        "/v1/systemone",
        {
            "state": {"ticket": "late"},
            "questions": {
                "route": {"type": "choice", "criteria": ["billing", "shipping"]},
                "urgency": {"type": "score", "criteria": ["low", {"level": "high"}]},
            },
        },
    ),
    "invocations-decisions": (
        "/invocations",
        {
            "model": MODEL,
            "input": "parcel",
            "questions": [
                {"type": "predicate", "instructions": "Is it about shipping?"},
                {
                    "type": "choice",
                    "instructions": "Which team?",
                    "choices": [{"value": "billing"}, {"value": True}],
                },
            ],
        },
    ),
    "completions-stream": (
        "/v1/completions",
        {"prompt": "Once upon", "max_tokens": 4, "stream": True},
    ),
}


@pytest.mark.parametrize(("path", "body"), EXPLICIT.values(), ids=EXPLICIT.keys())
def test_explicit(schemas, proxy_url: str, path: str, body: dict[str, Any]) -> None:
    case = schemas[NEGATIVE][path]["POST"].Case(body=body, media_type="application/json")
    response = case.call(base_url=proxy_url, timeout=60)
    case.validate_response(response, checks=CHECKS)
    assert response.status_code < 500, response.text


IMAGE = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
NO_TEXT = [{"role": "user", "content": [{"type": "text"}]}]
TOOL_CALLS = [{"role": "user", "content": "x", "tool_calls": 5}]


REFUSALS = {
    "F2-image": (
        "/v1/chat/completions",
        {"messages": IMAGE, "semif": SEMIF},
        {400},
        "messages.0.content.0",
    ),
    "F2-no-text": (
        "/v1/chat/completions",
        {"messages": NO_TEXT, "semif": SEMIF},
        {400},
        "messages.0.content.0",
    ),
    "F2-tool-calls": (
        "/v1/chat/completions",
        {"messages": TOOL_CALLS, "semif": SEMIF},
        {400},
        "messages.0.tool_calls",
    ),
    "F2-invocations": (
        "/invocations",
        {"messages": IMAGE, "semif": SEMIF},
        {400},
        "messages.0.content.0",
    ),
    "F3": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "semif": {**SEMIF, "temperature": 5e-324}},
        {200},
        None,
    ),
    "F5-n": ("/v1/chat/completions", {"messages": MESSAGES, "semif": SEMIF, "n": True}, {400}, "n"),
    "F5-tools": (
        "/v1/chat/completions",
        {"messages": MESSAGES, "semif": SEMIF, "tools": {}},
        {400},
        "tools",
    ),
}


@pytest.mark.parametrize(
    ("path", "body", "expected", "param"), REFUSALS.values(), ids=REFUSALS.keys()
)
def test_refusal(
    proxy_url: str, path: str, body: dict[str, Any], expected: set[int], param: str | None
) -> None:
    """Bad input gets a documented 4xx naming the field; valid input an answer."""
    resp = httpx.post(proxy_url + path, json=body, timeout=60)
    assert resp.status_code in expected, resp.text
    if resp.status_code == 400:
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert param is None or str(error["param"]).startswith(param)
    if resp.status_code == 200 and "semif" in body:
        assert sum(resp.json()["semif"]["probabilities"].values()) == pytest.approx(1, abs=1e-9)


def test_document_is_open_with_an_api_key(llama, logs_dir) -> None:
    proc, url, log = launch_proxy(logs_dir, llama.url, env={"PROXY_API_KEY": "k3y"})
    try:
        assert httpx.get(url + "/openapi.json", timeout=10).status_code == 200
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
    finally:
        stop(proc)
        log.close()
