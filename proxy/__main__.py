"""``python -m proxy``: parse flags, load settings once, serve until SIGINT/SIGTERM.

``python -m proxy calibrate DATA.jsonl --profile NAME`` fits a calibration
profile against a running proxy instead (see ``proxy/calibration``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys

from aiohttp import web

from . import calibration
from .app import create_app
from .config import Settings, load_settings
from .front import Server


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(argv, os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("proxy").info(
        "serving on http://%s:%d, upstream %s", settings.host, settings.port, settings.upstream_url
    )
    app = create_app(settings)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve(app, settings))
    return 0


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


def _loop_factory():
    """uvloop when installed: it roughly halves the proxy's CPU per request (bench/overhead.py)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(calibration.main(sys.argv[2:]) if sys.argv[1:2] == ["calibrate"] else main())
