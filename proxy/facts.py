"""What one request learns about itself as it is served, in one object handed down.

The middleware makes one ``Facts`` per request and keeps it on the request
(``app_keys.FACT_SHEET``); the routes hand it to the decision service with the request
(``records.Context.facts``), and the service hands it on, as an argument, to those that
learn something: admission (the estimate it admitted the decision with), the slot book
(time spent waiting for a llama-server slot), the reader (prompt tokens evaluated, which
tell admission how far an admitted decision is) and the upstream (time spent waiting on
llama-server). The middleware reads it back for the metrics and the ``Server-Timing``
header. Work that serves no request (the self-check) hands down none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .queueing import Work

__all__ = ["Facts", "UpstreamClock"]


class UpstreamClock:
    """Wall-clock seconds during which at least one llama-server call of a request
    was in progress (overlapping calls count once): ``with clock:`` around each call."""

    __slots__ = ("seconds", "_active", "_since")

    def __init__(self) -> None:
        self.seconds = 0.0
        self._active = 0
        self._since = 0.0

    def __enter__(self) -> None:
        if self._active == 0:
            self._since = time.perf_counter()
        self._active += 1

    def __exit__(self, *exc: object) -> None:
        self._active -= 1
        if self._active == 0:
            self.seconds += time.perf_counter() - self._since


@dataclass(eq=False)
class Facts:
    """One request's facts. ``slot_wait_s``: seconds its reads waited for a llama-server
    slot (proxy/kv.py), which is not time spent serving it; ``evaluated``: prompt tokens
    llama-server evaluated for it so far (proxy/reader.py); ``estimate``: the work and
    the seconds until its answer that admission admitted it with (None: none made);
    ``upstream``: its time waiting on llama-server (proxy/upstream.py)."""

    slot_wait_s: float = 0.0
    evaluated: int = 0
    estimate: tuple[Work, float] | None = None
    upstream: UpstreamClock = field(default_factory=UpstreamClock)
