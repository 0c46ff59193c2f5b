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
from aiohttp.http_exceptions import HttpProcessingError

from . import calibration
from .app import create_app
from .config import Settings, load_settings
from .server import Server


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(argv, os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_bad_requests_in_one_line)
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


def _bad_requests_in_one_line(record: logging.LogRecord) -> bool:
    """aiohttp logs a request it cannot parse (answered 400) as an ERROR with a traceback:
    it is the client's mistake, so one WARNING line, the parser's reason cut short."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, HttpProcessingError) and exc.code == 400:
        reason = " ".join(str(exc.message).split())[:160]
        record.msg, record.args = "bad HTTP request (answered 400): %s", (reason,)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
    return True


def _loop_factory():
    """uvloop when installed: it roughly halves the proxy's CPU per request (bench/overhead.py)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(calibration.main(sys.argv[2:]) if sys.argv[1:2] == ["calibrate"] else main())
