"""``python -m semif_tools COMMAND ...`` (installed: ``semif-tools``): the offline tools'
commands (``COMMANDS``), each with its own ``--help``."""

from __future__ import annotations

import sys

from . import COMMANDS, run

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ",".join(COMMANDS)
        usage = f"usage: python -m semif_tools {{{names}}} ... (each takes --help)"
        helped = argv[:1] in (["-h"], ["--help"])
        print(usage, file=sys.stdout if helped else sys.stderr)
        return 0 if helped else 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
