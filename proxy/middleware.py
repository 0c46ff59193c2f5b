"""The request middleware: metrics around everything, then authentication, then
the handler, with every failure (a ``ProxyError``, or a bug answered as ``InternalError``)
counted by ``handled`` and rendered into its API's error body by ``render_error``.
Each request gets its ``Facts`` (proxy/facts.py) here, under ``FACT_SHEET``: the handler
hands them down, and the metrics and the ``Server-Timing`` header read them back.

One middleware rather than three: each aiohttp middleware layer costs a call
chain per request, and a decision's whole hop is budgeted in microseconds
(bench/overhead.py).
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from .admission import server_timing
from .app_keys import API, ARRIVED, FACT_SHEET, KIND, METRICS, SETTINGS
from .config import Settings
from .errors import (
    InternalError,
    InvalidRequest,
    ProxyError,
    RequestTooLarge,
    Unauthorized,
    UnsupportedEncoding,
    UpstreamError,
    error_reply,
)
from .facts import Facts
from .metrics import after_reply

__all__ = ["MIDDLEWARES", "OPEN_PATHS", "authenticate", "handled", "render_error"]

log = logging.getLogger("proxy")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health", "/livez", "/ping", "/metrics", "/openapi.json", "/playground"})
# the request body codings aiohttp decodes (with backports.zstd and Brotli installed);
# the size limit applies to the decoded body, so a small body cannot inflate past it
DECODED = frozenset({"gzip", "deflate", "br", "zstd", "identity"})


@web.middleware
async def _serve(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "other"
    facts = request[FACT_SHEET] = Facts()  # handed down by the handler; read back here
    started = request[ARRIVED] = time.perf_counter()
    status = 499  # the client went away before an answer
    metrics.request_started(route)
    try:
        try:
            _authenticate(request)
            _check_encoding(request)
            response = await handler(request)
        except web.HTTPRequestEntityTooLarge:
            limit = request.app[SETTINGS].max_body_bytes
            coded = " (decoded)" if "Content-Encoding" in request.headers else ""
            response = _render(
                request,
                RequestTooLarge(f"the body{coded} is larger than the limit of {limit} bytes"),
            )
        except RequestPayloadError as exc:  # aiohttp could not decode or de-chunk the body
            cause = getattr(exc.__cause__, "message", None) or str(exc) or "malformed"
            response = _render(
                request,
                InvalidRequest(
                    f"the request body could not be read: {cause.strip()}", code="bad_body"
                ),
            )
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            if exc.status >= 500:
                response = _render(request, exc)
            else:
                err = InvalidRequest(exc.reason, code=exc.reason.lower().replace(" ", "_"))
                err.status = exc.status
                response = _render(request, err)
        except Exception as exc:  # noqa: BLE001 - a ProxyError, or a bug: answered in JSON
            response = _render(request, exc)
        status = response.status
        timing = server_timing(facts.estimate)
        if timing is not None and not response.prepared:  # a stream's headers are gone
            response.headers["Server-Timing"] = timing
        return response
    finally:
        after_reply(
            metrics.request_finished,
            route,
            request.get(KIND, "other"),
            status,
            time.perf_counter() - started,
            facts.upstream.seconds,
        )


def handled(
    app: web.Application, method: str, path: str, exc: Exception, *, what: str = "request"
) -> ProxyError:
    """The ``ProxyError`` that answers ``exc``, counted: a ``ProxyError`` as raised; anything
    else is a failure no handler expected, logged with its traceback under a new request id
    and answered as ``InternalError`` (500, the id in its message and ``X-Request-Id``;
    ``what`` failed: a request, or a jsonlines line). Every failure of a request (here) and
    of a jsonlines line (``routes/invocations.py``) goes through it."""
    if isinstance(exc, ProxyError):
        err = exc
    else:
        request_id = uuid.uuid4().hex[:16]
        log.error(
            "%s %s: a %s failed (request id %s)", method, path, what, request_id, exc_info=exc
        )
        err = InternalError(request_id, what)
    _count_error(app, method, path, err)
    return err


def _check_encoding(request: web.Request) -> None:
    """415 for a body coding aiohttp would pass through undecoded (it would then be read
    as if it were plain, and answered as invalid JSON or, relayed, misread upstream)."""
    coding = request.headers.get("Content-Encoding")
    if coding is not None and coding.strip().lower() not in DECODED:
        raise UnsupportedEncoding(
            f"Content-Encoding {coding!r} is not supported: send the body plain or as "
            "gzip, deflate, br or zstd (one coding)",
            param="Content-Encoding",
        )


def _authenticate(request: web.Request) -> None:
    # a CORS preflight carries no credentials by design: it is relayed, answered by
    # llama-server, and the request that follows it is checked
    if request.path not in OPEN_PATHS and request.method != "OPTIONS":
        authenticate(request.app[SETTINGS], request.headers.get("Authorization", ""))


def authenticate(settings: Settings, header: str) -> None:
    """Refuse (401) a request whose ``Authorization`` header lacks the configured key."""
    key = settings.api_key
    if key:
        scheme, _, token = header.partition(" ")
        given = token.strip().encode("utf-8", "surrogateescape")  # headers may hold any bytes
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, key.encode()):
            raise Unauthorized("a valid 'Authorization: Bearer <key>' header is required")


def _render(request: web.Request, exc: Exception) -> web.Response:
    api = request.get(API) or ("systemone" if request.path == "/v1/systemone" else "openai")
    return render_error(api, handled(request.app, request.method, request.path, exc))


def _count_error(app: web.Application, method: str, path: str, err: ProxyError) -> None:
    """``err`` counted (and an upstream failure logged): for an answer, or a jsonlines line."""
    metrics = app[METRICS]
    if isinstance(err, UpstreamError) and err.status >= 500:
        log.warning("%s %s -> %d %s", method, path, err.status, err.message)
        metrics.upstream_errors.labels(err.code).inc()
    elif err.status < 500:
        metrics.client_errors.labels(err.code).inc()


def render_error(api: str, err: ProxyError) -> web.Response:
    """``err`` in its API's error body ("openai" or "systemone"), built by ``errors.py``."""
    status, body, headers = error_reply(api, err)
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


MIDDLEWARES = (_serve,)
