"""``python -m proxy`` (installed: ``semif-proxy``): parse flags, load settings once, serve
until SIGINT/SIGTERM.

The offline tools are commands of their own package, ``python -m semif_tools calibrate|batch``
(installed: ``semif-tools``, pyproject.toml's ``[project.scripts]``); the server imports
nothing of theirs. ``python -m proxy calibrate|batch``, where they used to live, prints the
command to run instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import sys

from .app import create_app
from .config import load_settings
from .logs import setup_logging
from .server import loop_factory, serve

__all__ = ["MOVED", "main", "cli"]

# commands that were python -m proxy's and are python -m semif_tools's now
MOVED = ("calibrate", "batch")


def main(argv: list[str] | None = None) -> int:
    setup_logging()  # first: a removed setting is said at load
    settings = load_settings(argv, os.environ)
    logging.getLogger("proxy").info(
        "serving on http://%s:%d, upstream %s",
        settings.host,
        settings.port,
        settings.upstream_url,
    )
    app = create_app(settings)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(serve(app, settings))
    return 0


def cli(argv: list[str] | None = None) -> int:
    """``python -m proxy`` and ``semif-proxy``: serve; a moved command gets its new name
    (exit status 2), with the arguments it was given."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in MOVED:
        print(
            f"{argv[0]} is a command of the offline tools, not of the server: run\n"
            f"    python -m semif_tools {shlex.join(argv)}\n"
            f"(or semif-tools {argv[0]} ... where the package is installed with its tools "
            "extra: pip install 'semif-sidecar[tools]')",
            file=sys.stderr,
        )
        return 2
    return main(argv)


if __name__ == "__main__":
    sys.exit(cli())
