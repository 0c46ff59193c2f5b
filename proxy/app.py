"""The application factory: wiring only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from .admission import Admission
from .app_keys import ADMISSION, METRICS, MODELS, PROFILES, RECORDER, SETTINGS, UPSTREAM
from .config import Settings
from .errors import UpstreamError
from .metrics import Metrics
from .middleware import MIDDLEWARES
from .profile_store import ProfileStore
from .recorder import open_recorder
from .routes.chat import chat_completions
from .routes.decisions import decisions
from .routes.invocations import execution_parameters, invocations
from .routes.meta import health, livez, metrics, model, models, ping
from .routes.openapi import openapi
from .routes.playground import playground, report_figure, report_page
from .routes.relayed import relayed
from .routes.rerank import rerank
from .routes.systemone import system_one
from .served import ServedModels
from .service import DecisionService
from .upstream import Upstream
from .verdicts import Verdicts, this_cpu

__all__ = ["create_app"]


def create_app(
    settings: Settings,
    *,
    upstream: Upstream | None = None,
    records_to: Callable[[bytes], None] | None = None,
    records_key: bytes | None = None,
) -> web.Application:
    """``upstream``: llama-server's client (None: one for ``settings.upstream_url``);
    ``records_to`` and ``records_key``: where the decision records are written and the key
    their prompt hashes use, in place of the sink and key the settings name (None: those)."""
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=MIDDLEWARES,
    )
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[PROFILES] = ProfileStore(settings.calibration_dir, settings.calibration_profile or None)
    app.cleanup_ctx.append(_records_ctx(records_to, records_key))
    app.cleanup_ctx.append(_upstream_ctx(upstream))
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)
    app.router.add_post("/v1/systemone", system_one)
    app.router.add_post("/v1/decisions", decisions)
    # rerank: llama-server's four paths and Cohere's v2
    for path in ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking", "/v2/rerank"):
        app.router.add_post(path, rerank)
    app.router.add_get("/health", health)
    app.router.add_get("/livez", livez)  # liveness: the proxy alone
    app.router.add_get("/ping", ping)  # SageMaker: 200 only when llama-server is ready
    app.router.add_post("/invocations", invocations)  # SageMaker: any of the bodies above
    app.router.add_get("/execution-parameters", execution_parameters)  # Batch Transform
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/playground", playground)  # / stays llama-server's own web UI
    app.router.add_get("/playground/report", report_page)
    app.router.add_get("/playground/report/{file}", report_figure)
    # Every other path and method is llama-server's: relayed unchanged (routes/relayed.py).
    app.router.add_route("*", "/{path:.*}", relayed)
    return app


async def _settle(served: ServedModels, upstream: Upstream) -> None:
    """Watch llama-server for as long as the proxy serves: once it answers, and again each
    time it comes back after a restart (down at any check here, up at the next), count its
    slots and run (or recall) the self-check, so that it is done before the readiness probes
    say ready and no decision waits for it: one ``/health`` call a second."""
    while True:
        try:
            if await upstream.health():
                await served.settled()
        except UpstreamError:
            pass  # loading, or gone again: asked again below
        await asyncio.sleep(_SETTLE_POLL_S)


_SETTLE_POLL_S = 1.0


def _records_ctx(
    to: Callable[[bytes], None] | None, key: bytes | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        recorder = open_recorder(settings, app[METRICS], write_to=to, key=key)
        app[RECORDER] = recorder
        yield
        # after the upstream's cleanup (contexts close in reverse): every answer is made
        await asyncio.to_thread(recorder.close, min(5.0, settings.shutdown_timeout_s))

    return ctx


def _upstream_ctx(given: Upstream | None) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        upstream = given or Upstream(app[SETTINGS])
        kept = app[SETTINGS].check_verdicts
        path = None if kept in ("", "off") else Path(kept).expanduser()
        verdicts = Verdicts(path, cpu=this_cpu())
        app[UPSTREAM] = upstream
        settings = app[SETTINGS]
        admission = Admission(
            max_active=settings.max_active_decisions,
            max_queued=settings.max_queued_decisions,
            deadline_s=settings.decision_deadline_s,
            retry_after_s=settings.retry_after_s,
        )
        app[ADMISSION] = admission
        app[METRICS].watch(lambda: admission.active, lambda: admission.queued)
        # one decision service per served model, all admitted together
        app[MODELS] = ServedModels(
            upstream,
            lambda bound: DecisionService(
                bound,
                n_probs=settings.n_probs,
                question_fanout=settings.question_fanout,
                metrics=app[METRICS],
                admission=admission,
                ubatch=settings.upstream_ubatch,
                self_check=True,
                verdicts=verdicts,
                profiles=app[PROFILES],
            ),
            default_model=settings.default_model,
            aliases=settings.model_aliases,
        )
        settling = asyncio.get_running_loop().create_task(_settle(app[MODELS], upstream))
        yield
        settling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await settling
        await app[MODELS].close()
        if given is None:
            await upstream.close()

    return ctx
