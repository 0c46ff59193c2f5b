"""Health and model listing."""

from __future__ import annotations

import datetime as dt

from aiohttp import web

from ..app_keys import METRICS, MODELS, UPSTREAM
from ..errors import NotFound, NotReady, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from ..metrics import CONTENT_TYPE
from ..served import UnknownModel
from .common import json_response

__all__ = ["health", "livez", "models", "model", "ping", "metrics"]


async def livez(request: web.Request) -> web.Response:
    """200 while this process serves, whatever llama-server is doing: a liveness probe
    that a llama-server restart never fails (readiness is ``/health``)."""
    return json_response({"status": "alive"})


async def health(request: web.Request) -> web.Response:
    """200 ``{"status": "ok"}`` when llama-server is ready to answer and the proxy's
    repeatability self-check has settled; otherwise 503 ``NotReady`` in OpenAI's error
    shape, rendered like every route's errors (the proxy itself is up: ``/livez``)."""
    state = await _readiness(request.app)
    if state == "loading":
        raise NotReady(
            "llama-server is not ready: unreachable or loading its model",
            code="upstream_unavailable",
        )
    if state == "checking":
        raise NotReady(
            "the repeatability self-check is running; decisions wait until it settles",
            code="self_check_running",
        )
    return json_response({"status": "ok"})


async def ping(request: web.Request) -> web.Response:
    """SageMaker's health check: 200 only when llama-server can answer (within 1.5 s) and
    the self-check has settled (a first start's check: docs/operations.md)."""
    state = await _readiness(request.app)
    return web.Response(status=200 if state == "ok" else 503, text=state)


async def _readiness(app: web.Application) -> str:
    """ok, loading (llama-server does not answer) or checking (the self-check runs: every
    slot is leased to it, so a decision sent now would wait for it)."""
    if not await app[UPSTREAM].health():
        return "loading"
    try:
        settled = await app[MODELS].settled()
    except (UpstreamUnavailable, UpstreamTimeout):
        return "loading"
    except UpstreamError:  # no /props, refused credentials: decisions will say so
        return "ok"
    return "ok" if settled else "checking"


async def metrics(request: web.Request) -> web.Response:
    """The proxy's metrics (prometheus_client's text exposition)."""
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def models(request: web.Request) -> web.StreamResponse:
    """llama-server's OpenAI list (``object``, ``data``: every model, a router's too) plus
    every other name a model answers to (proxy/names.py) as OpenAI entries, and the
    System One list (``models``: name, description, release_date), in one body. Listing
    loads no model: a router's models are described from its list alone."""
    served = request.app[MODELS]
    listed = await request.app[UPSTREAM].models_list()
    if await served.router():
        default = await served.default_id()
        # the default first: it has the SDK names
        infos = sorted(listed.models, key=lambda i: i.id != default)
        build = ""
    else:
        infos = [await served.default_service().discovery.model()]
        build = infos[0].build
    known = {info.id for info in listed.models}
    extra, listing = [], []
    for i, info in enumerate(infos):
        names = served.names_of(info, default=i == 0).listed
        extra += [_entry(n, info.created) for n in names if n not in known]
        known.update(names)
        released = dt.datetime.fromtimestamp(info.created or 0, dt.UTC).date().isoformat()
        listing += [
            {
                "name": name,
                "description": f"{info.id} served by llama-server, read as a decision model",
                "release_date": released,
            }
            for name in names
        ]
    body = {**listed.body, "data": [*listed.entries, *extra]}
    body["models"] = listing
    body["x_llama_build"] = build
    body["x_repeatable"] = served.checks()  # the self-check of each model read so far
    return json_response(body)


def _entry(name: str, created: int | None) -> dict[str, object]:
    return {"id": name, "object": "model", "created": created or 0, "owned_by": "llamacpp"}


async def model(request: web.Request) -> web.StreamResponse:
    """``GET /v1/models/{id}``: OpenAI's model object for any name a served model answers
    to; 404 in OpenAI's shape otherwise."""
    wanted = request.match_info["model"]
    try:
        service = await request.app[MODELS].service(wanted)
    except UnknownModel as exc:
        raise NotFound(
            f"the model {wanted!r} does not exist; this server answers as {list(exc.names)}",
            param="model",
        ) from exc
    # a router's model is not asked (/props would load it): described by its name alone
    created = None if request.app[MODELS].several else (await service.discovery.model()).created
    return json_response(_entry(wanted, created))
