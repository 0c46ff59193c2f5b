"""Helpers every route shares: JSON bodies in, relayed upstream answers out."""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from ..admission import Work
from ..app_keys import ADMISSION, ARRIVED, FACT_SHEET, KIND, METRICS, MODELS, RECORDER, SETTINGS
from ..cost import CHUNK, DEFAULT_UBATCH, ONE, CostModel, kind_of
from ..deadlines import Deadline, request_deadline
from ..errors import InvalidRequest, UpstreamError, openai_error_body
from ..protocol.relayed import generation_tokens
from ..recorder import Context, Decided, request_id
from ..service import Answered, Asked, DecisionService
from ..upstream import Upstream

__all__ = [
    "MAX_DEPTH",
    "json_object",
    "check_depth",
    "json_response",
    "context_of",
    "deadline_of",
    "request_header",
    "recorded",
    "relay",
    "routed",
]

# Deeper JSON than this in a decision body is refused: it has no business in a
# prompt, and the encoders behind us stop at 255 (orjson) or ~1000 (json) levels.
MAX_DEPTH = 64


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object", code="invalid_json")
    return data


def check_depth(value: Any, raw: bytes | None = None, limit: int = MAX_DEPTH) -> None:
    """Refuse (400) a body nested deeper than ``limit`` arrays and objects.

    ``raw``, the body's bytes, settles most bodies at C speed: with no more than
    ``limit`` opening brackets in all (inside strings too), none can be deeper."""
    if raw is not None and raw.count(b"[") + raw.count(b"{") <= limit:
        return
    todo = [(value, 1)] if isinstance(value, (dict, list)) else []
    while todo:
        node, depth = todo.pop()
        if depth > limit:
            raise InvalidRequest(f"the body is nested deeper than {limit} levels", code="too_deep")
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                todo.append((child, depth + 1))


def routed(raw: bytes, body: dict[str, Any], service: DecisionService) -> bytes:
    """The body to relay for ``service``'s model: unchanged, except that behind a
    llama-server router it names the model the proxy resolved (a default name, an alias
    of ours or no name at all means nothing to the router)."""
    model = service.upstream.model
    if model is None or body.get("model") == model:
        return raw
    return orjson.dumps({**body, "model": model})


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def context_of(request: web.Request, api: str, **more: Any) -> Context:
    """A decision request's id, arrival and deadline (proxy/recorder.py); its API's name,
    or "invocations" when it came through SageMaker's path."""
    return Context(
        request_id(request.headers, request.app[METRICS]),
        "invocations" if request.path == "/invocations" else api,
        request.get(ARRIVED) or time.perf_counter(),
        deadline=deadline_of(request),
        facts=request[FACT_SHEET],
        **more,
    )


def deadline_of(request: web.Request) -> Deadline:
    """The deadline a decision request asks for in its headers, within the server's
    maximum, else the server's (proxy/deadlines.py); a bad value is a 400 naming its header."""
    settings = request.app[SETTINGS]
    return request_deadline(
        request.headers, settings.decision_deadline_s, settings.max_decision_deadline_s
    )


def request_header(context: Context) -> dict[str, str]:
    """The header every decision answer sends its request id back in."""
    return {"X-Request-Id": context.request_id}


def recorded(
    app: web.Application,
    context: Context,
    asked: Asked,
    answered: Answered,
    service: DecisionService,
) -> Decided:
    """The decisions' ids, and their records made and sent where ``--decision-records``
    says (never failing the answer: a record that cannot be queued is counted, logged)."""
    info = service.discovery.known
    return app[RECORDER].decided(context, asked, answered, info.build if info else None)


# about how many bytes of a JSON chat body make one prompt token (English text)
_BYTES_PER_TOKEN = 4


def relayed_work(app: web.Application, path: str, body: dict[str, Any], raw: bytes) -> Work | None:
    """What a relayed request will take on the default model (``relayed_cost``)."""
    cost = app[MODELS].default_service().reader.cost
    settings = app[SETTINGS]
    return relayed_cost(path, body, raw, settings.relay_max_tokens, cost, settings.upstream_ubatch)


def relayed_cost(
    path: str, body: dict[str, Any], raw: bytes, cap: int, cost: CostModel, ubatch: int = 0
) -> Work | None:
    """What a relayed generation will take, for admission to count: its prompt (about
    one token per four bytes of its body) evaluated, then each token it may generate
    (``generation_tokens``) costed as a one-token read, on the measured ``cost``
    (proxy/cost.py); None while those are unknown or nothing is generated.

    Admission judges it by when its first token can come (``Work.first_s``) when the
    client sees tokens as they come (a stream) or named no length (the cap is then a
    bound, not what it expects); a whole answer of a length the client named must come
    within the proxy's wait for llama-server, so that is judged by all of it.

    Beside a decision's prompt, each token waits for a llama-server iteration that also
    evaluates a chunk of that prompt (``ubatch`` tokens, llama-server's -ub; 512 when
    unknown): ``Work.paced_s``, how long a decision admitted behind it may wait for its
    slot (a burst measured generations of 64 tokens taking 28 s beside long prompts, 2.5 s
    beside each other)."""
    out = generation_tokens(path, body, cap)
    if out is None:
        return None
    prompt = max(1, len(raw) // _BYTES_PER_TOKEN)
    read = cost.step_s(CHUNK, prompt, 0)
    token = cost.step_s(ONE, 1, prompt)
    if read is None or token is None:
        return None
    whole = body.get("stream") is not True and generation_tokens(path, body, 0) is not None
    chunk = ubatch or DEFAULT_UBATCH
    beside = cost.step_s(kind_of(chunk, ubatch), chunk, prompt) or 0.0
    return Work(
        prompt,
        read + out * token,
        first_s=None if whole else read + token,
        paced_s=read + out * max(token, beside),
    )


async def relay(
    request: web.Request,
    upstream: Upstream,
    body: bytes | None,
    path: str | None = None,
    work: Work | None = None,
    resend: bool = True,
) -> web.StreamResponse:
    """Send the client's request to llama-server unchanged and copy the answer back.

    ``path`` is the upstream path (default: the request's own; /invocations
    relays to /v1/chat/completions). Event streams are copied chunk by chunk
    as they arrive; other bodies whole. ``work``: what it will take, counted by
    admission while it runs (``relayed_work``). ``resend``: whether a request that
    llama-server's connection dropped before answering may be sent again
    (``Upstream.relay``).
    """
    request[KIND] = "relay"
    target = path or request.path
    if request.query_string:
        target += "?" + request.query_string
    timeout_s = request.app[SETTINGS].request_timeout_s
    async with (
        request.app[ADMISSION].relayed(work, timeout_s),
        upstream.relay(request.method, target, body, request.headers, resend) as up,
    ):
        if not up.is_stream:
            payload = b"".join([chunk async for chunk in up.chunks])
            return web.Response(status=up.status, body=payload, headers=up.headers)
        response = web.StreamResponse(status=up.status, headers=up.headers)
        await response.prepare(request)
        try:
            async for chunk in up.chunks:
                await response.write(chunk)
        except UpstreamError as err:
            # The status line is gone already: end the stream with an error event.
            request.app[METRICS].upstream_errors.labels(err.code).inc()
            await response.write(b"\n\ndata: " + orjson.dumps(openai_error_body(err)) + b"\n\n")
        await response.write_eof()
        return response
