"""The offline tools: clients of a running proxy, not part of serving.

    python -m semif_tools calibrate DATA.jsonl --profile NAME   fit a calibration profile
    python -m semif_tools batch IN.jsonl OUT.jsonl              answer a file of requests
    python -m semif_tools drift --records R --outcomes O --out report.html
                                                                drift of recorded decisions
    python -m semif_tools records-from-capture ...              records from Data Capture

(``semif-tools calibrate ...`` and so on where the package is installed: pyproject.toml's
``[project.scripts]``.) They need the ``tools`` extra: ``pip install 'semif-sidecar[tools]'``
(``make venv`` installs it). They import ``proxy`` (the profile format, the maps, the
prompt version); ``proxy`` imports nothing from here (tests/unit/test_imports.py).

    client.py       the one HTTP client (httpx) and the one retry policy (tenacity)
    progress.py     the one progress bar (tqdm, on stderr)
    batch.py        the batch command
    calibrate/      the calibrate command: reading, fitting, the report (see its __init__)
    record_files.py decision records read back: load (one per decision id), keys, agree
    outcomes.py     outcomes read and written (CSV, as AWS documents), joined to records
    files.py        the files a command is given: files, or synced dated folders
    drift_cli.py    the drift command; drift.py its table, drift_page.py its HTML page
    capture.py      records-from-capture: decision records from SageMaker Data Capture files
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "EXTRA", "INSTALL", "run"]

# each command's module; it has main(argv) -> exit status
COMMANDS = {
    "calibrate": "semif_tools.calibrate.cli",
    "batch": "semif_tools.batch",
    "drift": "semif_tools.drift_cli",
    "records-from-capture": "semif_tools.capture",
}
# the tools extra (pyproject.toml), by the name each is imported as
EXTRA = ("httpx", "matplotlib", "tenacity", "tqdm")
INSTALL = "pip install 'semif-sidecar[tools]'"


def run(name: str, argv: Sequence[str]) -> int:
    """Run the command ``name`` with ``argv``; its module is imported only now. A module of
    the tools extra that is not installed is said on stderr (exit status 2)."""
    try:
        main = importlib.import_module(COMMANDS[name]).main
        return int(main(list(argv)))
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in EXTRA:
            raise
        print(
            f"{name} needs {missing}, of the tools extra, which is not installed: {INSTALL}",
            file=sys.stderr,
        )
        return 2
