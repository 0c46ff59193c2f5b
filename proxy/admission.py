"""Backpressure: a bounded number of decisions run, a bounded number wait.

Past both bounds a request is refused at once with ``Overloaded`` (429 and
Retry-After) instead of joining an unbounded queue. Each admitted decision
also runs under a deadline; when it passes, the work is cancelled (which
closes its llama-server connections, so llama-server stops too) and the
request gets ``UpstreamTimeout`` (504).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .errors import Overloaded, UpstreamTimeout

__all__ = ["Admission"]


class Admission:
    def __init__(self, *, max_active: int, max_queued: int, deadline_s: float, retry_after_s: int):
        if max_active < 1 or max_queued < 0:
            raise ValueError("max_active must be >= 1 and max_queued >= 0")
        self._slots = asyncio.Semaphore(max_active)
        self._max_queued = max_queued
        self._queued = 0
        self._deadline_s = deadline_s
        self._retry_after_s = retry_after_s

    @property
    def queued(self) -> int:
        return self._queued

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Run the block once a slot is free, within the deadline (counted from this call,
        so time spent queued counts)."""
        if self._slots.locked() and self._queued >= self._max_queued:
            raise Overloaded(
                "too many decisions in flight and queued; retry later",
                retry_after_s=self._retry_after_s,
            )
        try:
            async with asyncio.timeout(self._deadline_s):
                self._queued += 1
                try:
                    await self._slots.acquire()
                finally:
                    self._queued -= 1
                try:
                    yield
                finally:
                    self._slots.release()
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"the decision did not finish within the {self._deadline_s:g} s deadline"
            ) from exc
