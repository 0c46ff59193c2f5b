"""Counted slots with a FIFO hand-over: what admission and the connection pool share.

At most ``limit`` holders. Others wait in arrival order; a released slot goes
straight to the next waiter, so a newcomer can never overtake the queue.
Unlike ``asyncio.Semaphore`` (pure Python, several frames per call), taking a
free slot is one comparison: this runs on every decision.
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["Slots"]


class Slots:
    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._limit = limit
        self._taken = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def taken(self) -> int:
        return self._taken

    def full(self) -> bool:
        """Every slot taken (waiters, if any, are handed slots as they are released)."""
        return self._taken >= self._limit

    def take(self) -> bool:
        """A slot now, if one is free and nobody waits for it."""
        if self._taken < self._limit and not self._waiting:
            self._taken += 1
            return True
        return False

    async def wait(self) -> None:
        """Queue until a slot is handed over. Cancelled, it leaves no slot behind."""
        if self.take():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter  # resolved by release, which hands its slot over
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over as we were cancelled: pass it on
            elif waiter in self._waiting:  # release may have skipped it already
                self._waiting.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the next in line
                return
        self._taken -= 1
