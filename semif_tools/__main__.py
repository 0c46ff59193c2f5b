"""``python -m semif_tools calibrate|batch ...``: the same commands as ``python -m proxy``'s."""

from __future__ import annotations

import sys

from . import COMMANDS, run


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        usage = f"usage: python -m semif_tools {{{','.join(COMMANDS)}}} ... (each takes --help)"
        helped = argv[:1] in (["-h"], ["--help"])
        print(usage, file=sys.stdout if helped else sys.stderr)
        return 0 if helped else 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
