"""Backpressure: a bounded number of decisions run, a bounded number wait.

Past both bounds a request is refused at once with ``Overloaded`` (429 and
Retry-After) instead of joining an unbounded queue. Each admitted decision
also runs under a deadline; when it passes, the work is cancelled (which
closes its llama-server connections, so llama-server stops too) and the
request gets ``UpstreamTimeout`` (504).
"""

from __future__ import annotations

import asyncio

from .errors import Overloaded, UpstreamTimeout
from .slots import Slots

__all__ = ["Admission"]


class Admission:
    def __init__(self, *, max_active: int, max_queued: int, deadline_s: float, retry_after_s: int):
        if max_active < 1 or max_queued < 0:
            raise ValueError("max_active must be >= 1 and max_queued >= 0")
        self._slots = Slots(max_active)
        self._max_queued = max_queued
        self._deadline_s = deadline_s
        self._retry_after_s = retry_after_s

    @property
    def queued(self) -> int:
        return self._slots.waiting

    def admit(self) -> _Admitted:
        """Run the block once a slot is free, within the deadline (counted from this call,
        so time spent queued counts)."""
        if self._slots.full() and self._slots.waiting >= self._max_queued:
            raise Overloaded(
                "too many decisions in flight and queued; retry later",
                retry_after_s=self._retry_after_s,
            )
        return _Admitted(self)


class _Admitted:
    """``async with admission.admit():`` a slot, and the deadline around the block.

    The deadline is ``asyncio.timeout``'s logic on one timer handle: this runs for
    every decision, and asyncio's pure-Python ``Timeout`` costs several frames
    more (bench/overhead.py)."""

    __slots__ = ("_admission", "_holding", "_task", "_timer", "_expired", "_cancelling")

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._holding = False

    async def __aenter__(self) -> None:
        admission = self._admission
        task = asyncio.current_task()
        assert task is not None
        self._task, self._expired, self._cancelling = task, False, task.cancelling()
        self._timer = task.get_loop().call_later(admission._deadline_s, self._expire)
        if not admission._slots.take():  # the common case takes a free slot, awaiting nothing
            try:
                await admission._slots.wait()
            except BaseException as exc:
                await self.__aexit__(type(exc), exc, exc.__traceback__)
                raise
        self._holding = True

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._holding:
            self._holding = False
            self._admission._slots.release()
        self._timer.cancel()
        # our cancel, not someone else's: the work ran out of time
        if (self._expired and self._task.uncancel() <= self._cancelling
                and exc_type is asyncio.CancelledError):
            raise UpstreamTimeout(
                f"the decision did not finish within the {self._admission._deadline_s:g} s "
                "deadline"
            ) from exc
