"""``python -m proxy``: parse flags, load settings once, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import os
import sys

from aiohttp import web

from .app import create_app
from .config import load_settings


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(argv, os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("proxy").info(
        "serving on http://%s:%d, upstream %s", settings.host, settings.port, settings.upstream_url
    )
    web.run_app(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        access_log=None,
        handler_cancellation=True,  # a client that disconnects cancels its upstream call
        shutdown_timeout=settings.shutdown_timeout_s,
        print=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
