"""The request middleware: metrics around everything, then authentication, then
the handler, with every ``ProxyError`` rendered into its API's error body.

One middleware rather than three: each aiohttp middleware layer costs a call
chain per request, and a decision's whole hop is budgeted in microseconds
(bench/overhead.py).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from .app_keys import API, KIND, METRICS, SETTINGS
from .config import Settings
from .errors import (
    InvalidRequest,
    ProxyError,
    RequestTooLarge,
    Unauthorized,
    UpstreamError,
    openai_error_response,
    system_one_error_response,
)
from .metrics import after_reply, upstream_seconds

__all__ = ["MIDDLEWARES", "OPEN_PATHS", "authenticate", "render_error"]

log = logging.getLogger("proxy")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/openapi.json"})


@web.middleware
async def _serve(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "other"
    upstream = upstream_seconds()
    started = time.perf_counter()
    status = 499  # the client went away before an answer
    metrics.request_started(route)
    try:
        try:
            _authenticate(request)
            response = await handler(request)
        except ProxyError as err:
            response = _render(request, err)
        except web.HTTPRequestEntityTooLarge:
            limit = request.app[SETTINGS].max_body_bytes
            response = _render(
                request, RequestTooLarge(f"the body is larger than the limit of {limit} bytes"))
        except web.HTTPException as exc:
            if exc.status < 400 or exc.status == 500:
                raise
            err = InvalidRequest(exc.reason, code=exc.reason.lower().replace(" ", "_"))
            err.status = exc.status
            response = _render(request, err)
        status = response.status
        return response
    except Exception:
        status = 500  # escaped every handler: counted, never hidden as a client error
        raise
    finally:
        after_reply(metrics.request_finished, route, request.get(KIND, "other"), status,
                    time.perf_counter() - started, upstream.seconds)


def _authenticate(request: web.Request) -> None:
    if request.path not in OPEN_PATHS:
        authenticate(request.app[SETTINGS], request.headers.get("Authorization", ""))


def authenticate(settings: Settings, header: str) -> None:
    """Refuse (401) a request whose ``Authorization`` header lacks the configured key."""
    key = settings.api_key
    if key:
        scheme, _, token = header.partition(" ")
        given = token.strip().encode("utf-8", "surrogateescape")  # headers may hold any bytes
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, key.encode()):
            raise Unauthorized("a valid 'Authorization: Bearer <key>' header is required")


def _render(request: web.Request, err: ProxyError) -> web.Response:
    api = request.get(API) or ("systemone" if request.path == "/v1/systemone" else "openai")
    return render_error(request.app, request.method, request.path, api, err)


def render_error(app: web.Application, method: str, path: str, api: str, err: ProxyError
                 ) -> web.Response:
    """``err`` counted and rendered in its API's error body ("openai" or "systemone")."""
    metrics = app[METRICS]
    if isinstance(err, UpstreamError) and err.status >= 500:
        log.warning("%s %s -> %d %s", method, path, err.status, err.message)
        metrics.upstream_errors.labels(err.code).inc()
    elif err.status < 500:
        metrics.client_errors.labels(err.code).inc()
    return system_one_error_response(err) if api == "systemone" else openai_error_response(err)


MIDDLEWARES = (_serve,)
