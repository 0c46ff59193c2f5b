"""The tools' one progress bar: tqdm, on stderr.

On a terminal it is drawn as it moves (count, rate, elapsed and remaining time). When
stderr is not a terminal (a log file, a pipe) nothing is drawn while it runs, and its
final state is written once, as one line, when it closes.
"""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["Bar"]


class Bar(tqdm):
    """``with Bar(total, "reading", unit="item") as bar: ... bar.update(1)``."""

    def __init__(
        self,
        total: int,
        label: str,
        *,
        unit: str = "it",
        stream: TextIO | None = None,
        **kwargs: Any,
    ):
        stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(stream, "isatty", lambda: False)())
        super().__init__(
            total=total,
            desc=label,
            unit=unit,
            file=stream,
            leave=True,
            dynamic_ncols=self.live,
            delay=0 if self.live else math.inf,
            **kwargs,
        )

    def close(self) -> None:
        if not getattr(self, "disable", True) and not self.live:
            self.fp.write(str(self) + "\n")  # tqdm.__str__: the bar as it now stands
            self.fp.flush()
        super().close()
