"""``python -m proxy``: parse flags, load settings once, serve until SIGINT/SIGTERM.

``python -m proxy calibrate DATA.jsonl --profile NAME`` fits a calibration profile
against a running proxy instead, and ``python -m proxy batch IN.jsonl OUT.jsonl``
answers a file of requests through one: both are offline tools of the package
``semif_tools`` (the ``tools`` extra), imported only when one of them is run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from . import workers
from .app import create_app
from .config import load_settings
from .logs import setup_logging
from .server import loop_factory, serve

TOOLS = ("calibrate", "batch")
INSTALL_TOOLS = "pip install 'semif-sidecar[tools]'"


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(argv, os.environ)
    setup_logging()
    logging.getLogger("proxy").info(
        "serving on http://%s:%d, upstream %s%s",
        settings.host,
        settings.port,
        settings.upstream_url,
        f", {settings.workers} workers" if settings.workers > 1 else "",
    )
    if settings.workers > 1:
        return workers.run(settings)
    app = create_app(settings)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(serve(app, settings))
    return 0


def tool(name: str, argv: list[str]) -> int:
    """Run the offline tool ``name`` (``semif_tools``); the server never imports it."""
    try:
        import semif_tools
    except ModuleNotFoundError as exc:
        if exc.name != "semif_tools":
            raise
        print(
            f"python -m proxy {name} needs the offline tools, which are not installed: "
            f"{INSTALL_TOOLS}",
            file=sys.stderr,
        )
        return 2
    return semif_tools.run(name, argv)


def _command(argv: list[str]) -> int:
    if argv[:1] and argv[0] in TOOLS:
        return tool(argv[0], argv[1:])
    return main(argv)


if __name__ == "__main__":
    sys.exit(_command(sys.argv[1:]))
