"""``python -m semif_tools calibrate|batch ...``: the same commands as ``python -m proxy``'s;
``python -m semif_tools drift ...``: the drift report (here only)."""

from __future__ import annotations

import sys

from . import COMMANDS, OFFLINE, run


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {**COMMANDS, **OFFLINE}:
        names = ",".join([*COMMANDS, *OFFLINE])
        usage = f"usage: python -m semif_tools {{{names}}} ... (each takes --help)"
        helped = argv[:1] in (["-h"], ["--help"])
        print(usage, file=sys.stdout if helped else sys.stderr)
        return 0 if helped else 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
