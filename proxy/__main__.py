"""``python -m proxy``: parse flags, load settings once, serve until SIGINT/SIGTERM.

``python -m proxy calibrate DATA.jsonl --profile NAME`` fits a calibration
profile against a running proxy instead (see ``proxy/calibration``);
``python -m proxy batch IN.jsonl OUT.jsonl`` answers a file of requests
through one (``proxy/batch.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from . import calibration, workers
from .app import create_app
from .config import load_settings
from .logs import setup_logging
from .server import loop_factory, serve


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(argv, os.environ)
    setup_logging()
    logging.getLogger("proxy").info(
        "serving on http://%s:%d, upstream %s%s", settings.host, settings.port,
        settings.upstream_url, f", {settings.workers} workers" if settings.workers > 1 else "")
    if settings.workers > 1:
        return workers.run(settings)
    app = create_app(settings)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(serve(app, settings))
    return 0


def _command(argv: list[str]) -> int:
    if argv[:1] == ["calibrate"]:
        return calibration.main(argv[1:])
    if argv[:1] == ["batch"]:
        from .batch import main as batch  # a client: not imported by the server

        return batch(argv[1:])
    return main(argv)


if __name__ == "__main__":
    sys.exit(_command(sys.argv[1:]))
