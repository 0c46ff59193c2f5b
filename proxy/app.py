"""The application factory: wiring only."""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from .app_keys import SERVICE, SETTINGS, UPSTREAM
from .config import Settings
from .errors import (
    InvalidRequest,
    ProxyError,
    RequestTooLarge,
    Unauthorized,
    openai_error_response,
    system_one_error_response,
)
from .routes.chat import chat_completions
from .routes.common import relay
from .routes.meta import health, models
from .routes.systemone import system_one
from .service import DecisionService
from .upstream import Upstream

__all__ = ["create_app"]

log = logging.getLogger("proxy")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_OPEN_PATHS = frozenset({"/health", "/ping", "/metrics"})


def create_app(settings: Settings, *, upstream: Upstream | None = None) -> web.Application:
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[_errors, _auth],
    )
    app[SETTINGS] = settings
    app.cleanup_ctx.append(_upstream_ctx(upstream))
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/systemone", system_one)
    app.router.add_get("/health", health)
    for path in ("/v1/completions", "/v1/embeddings"):
        app.router.add_post(path, _relay_route)
    return app


def _upstream_ctx(given: Upstream | None) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        upstream = given or Upstream(app[SETTINGS])
        app[UPSTREAM] = upstream
        app[SERVICE] = DecisionService(upstream, n_probs=app[SETTINGS].n_probs)
        yield
        if given is None:
            await upstream.close()

    return ctx


async def _relay_route(request: web.Request) -> web.StreamResponse:
    return await relay(request, request.app[UPSTREAM], await request.read())


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    render = system_one_error_response if request.path == "/v1/systemone" else openai_error_response
    try:
        return await handler(request)
    except ProxyError as err:
        if err.status >= 500:
            log.warning("%s %s -> %d %s", request.method, request.path, err.status, err.message)
        return render(err)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].max_body_bytes
        return render(RequestTooLarge(f"the body is larger than the limit of {limit} bytes"))
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.status != 500:
            return render(_http_error(exc))
        raise


def _http_error(exc: web.HTTPException) -> ProxyError:
    err = InvalidRequest(exc.reason, code=exc.reason.lower().replace(" ", "_"))
    err.status = exc.status
    return err


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    key = request.app[SETTINGS].api_key
    if key and request.path not in _OPEN_PATHS:
        given = request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise Unauthorized("a valid 'Authorization: Bearer <key>' header is required")
    return await handler(request)
