"""``python -m proxy``: parse flags, load settings once, serve until SIGINT/SIGTERM.

``python -m proxy calibrate DATA.jsonl --profile NAME`` fits a calibration
profile against a running proxy instead (see ``proxy/calibration``).
"""

from __future__ import annotations

import gc
import logging
import os
import sys

from aiohttp import web

from . import calibration
from .app import create_app
from .config import load_settings


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(argv, os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("proxy").info(
        "serving on http://%s:%d, upstream %s", settings.host, settings.port, settings.upstream_url
    )
    loop = _event_loop()
    app = create_app(settings)
    # Everything built so far lives as long as the process: keep it out of the
    # collector's full passes (about 30 ms each over ~50,000 start-up objects).
    gc.freeze()
    web.run_app(
        app,
        loop=loop,
        host=settings.host,
        port=settings.port,
        access_log=None,
        handler_cancellation=True,  # a client that disconnects cancels its upstream call
        shutdown_timeout=settings.shutdown_timeout_s,
        print=None,
    )
    return 0


def _event_loop():
    """uvloop when installed: it roughly halves the proxy's CPU per request (bench/overhead.py)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop()


if __name__ == "__main__":
    sys.exit(calibration.main(sys.argv[2:]) if sys.argv[1:2] == ["calibrate"] else main())
