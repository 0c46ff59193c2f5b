"""Backpressure: a bounded number of decisions run, a bounded number wait.

Past both bounds a request is refused at once with ``Overloaded`` (429 and
Retry-After) instead of joining an unbounded queue. Each admitted decision
also runs under a deadline; when it passes, the work is cancelled (which
closes its llama-server connections, so llama-server stops too) and the
request gets ``UpstreamTimeout`` (504).
"""

from __future__ import annotations

import asyncio
import collections

from .errors import Overloaded, UpstreamTimeout

__all__ = ["Admission"]


class Admission:
    def __init__(self, *, max_active: int, max_queued: int, deadline_s: float, retry_after_s: int):
        if max_active < 1 or max_queued < 0:
            raise ValueError("max_active must be >= 1 and max_queued >= 0")
        self._max_active = max_active
        self._max_queued = max_queued
        self._active = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._deadline_s = deadline_s
        self._retry_after_s = retry_after_s

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def admit(self) -> _Admitted:
        """Run the block once a slot is free, within the deadline (counted from this call,
        so time spent queued counts)."""
        if self._active >= self._max_active and len(self._waiting) >= self._max_queued:
            raise Overloaded(
                "too many decisions in flight and queued; retry later",
                retry_after_s=self._retry_after_s,
            )
        return _Admitted(self)

    async def _acquire(self) -> None:
        if self._active < self._max_active and not self._waiting:
            self._active += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter  # resolved by _release, which hands its slot over
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot was handed over as we were cancelled: pass it on
            elif waiter in self._waiting:  # _release may have skipped it already
                self._waiting.remove(waiter)
            raise

    def _release(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the next in line
                return
        self._active -= 1


class _Admitted:
    """``async with admission.admit():`` a slot, and the deadline around the block."""

    __slots__ = ("_admission", "_timeout", "_holding")

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._holding = False

    async def __aenter__(self) -> None:
        admission = self._admission
        self._timeout = asyncio.timeout(admission._deadline_s)
        await self._timeout.__aenter__()
        try:
            await admission._acquire()
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._holding = True

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._holding:
            self._holding = False
            self._admission._release()
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError as timeout:
            raise UpstreamTimeout(
                f"the decision did not finish within the {self._admission._deadline_s:g} s "
                "deadline"
            ) from timeout
