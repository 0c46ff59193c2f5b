"""The proxy listening on ``settings.host:port``: aiohttp serves every request.

HTTP parsing and framing are aiohttp's (llhttp); this module only sets the
limits and the drain: idle keep-alive connections close after ``keepalive_s``,
a client that disconnects cancels its handler (and so its upstream call), and
``close`` stops listening, closes idle connections, gives requests in progress
``shutdown_timeout_s`` to finish, then cancels the rest.
"""

from __future__ import annotations

import asyncio
import gc
import signal

from aiohttp import web

from .config import Settings

__all__ = ["Server", "KEEPALIVE_S", "serve", "loop_factory"]

KEEPALIVE_S = 75.0  # aiohttp's default


class Server:
    def __init__(
        self,
        app: web.Application,
        settings: Settings,
        *,
        keepalive_s: float = KEEPALIVE_S,
    ):
        self._settings = settings
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,  # a client that disconnects cancels its upstream call
            keepalive_timeout=keepalive_s,
            shutdown_timeout=settings.shutdown_timeout_s,
        )
        self._closed = False

    async def start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(
            self._runner,
            self._settings.host,
            self._settings.port,
        ).start()

    @property
    def port(self) -> int:
        return self._runner.addresses[0][1]

    async def close(self) -> None:
        """Drain (aiohttp's graceful shutdown), then clean the application up."""
        if not self._closed:
            self._closed = True
            await self._runner.cleanup()


async def serve(app: web.Application, settings: Settings) -> None:
    """Serve until SIGINT or SIGTERM, then drain (see ``Server.close``)."""
    server = Server(app, settings)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Everything built so far lives as long as the process: keep it out of the
    # collector's full passes (about 30 ms each over ~50,000 start-up objects).
    gc.freeze()
    try:
        await stop.wait()
    finally:
        await server.close()


def loop_factory():
    """uvloop when installed: it roughly halves the proxy's CPU per request (bench/overhead.py)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
