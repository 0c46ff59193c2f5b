"""A request's questions about one conversation: the first read alone, the rest fanned out.

The first question is read alone: it computes the conversation's KV in one slot. The
rest follow ``question_fanout`` at a time (0: one per slot this process leases). One at
a time, each lands in the slot that holds the conversation and computes only its own
question. In parallel (``fans_out``), on the segment scheme (a GPU's, as deploy/ sets it
up) every other slot computes the conversation once more, which costs more than it
saves on a CPU (bench/shared_state.py) and is meant for a GPU; on the prefix scheme (a
CPU's) they wait for the slot reading it as any decision does (proxy/kv.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

__all__ = ["fan_out"]

Q = TypeVar("Q")
T = TypeVar("T")


async def fan_out(
    items: Sequence[tuple[str, Q]],
    one: Callable[[str, Q, bool], Awaitable[T]],
    *,
    per_turn: int,
    fans_out: bool,
) -> dict[str, T]:
    """``one(id, question, in_fan_out)`` for every item, by id in the items' order: the
    first alone (never in a fan-out), then the rest ``per_turn`` at a time, each in a
    fan-out as ``fans_out`` says. The first failure among the rest speaks for them all."""
    first_id, first = items[0]
    outcomes = {first_id: await one(first_id, first, False)}
    if len(items) > 1:
        limit = asyncio.Semaphore(per_turn)

        async def limited(qid: str, question: Q) -> None:
            async with limit:
                outcomes[qid] = await one(qid, question, fans_out)

        try:
            async with asyncio.TaskGroup() as group:
                for qid, question in items[1:]:
                    group.create_task(limited(qid, question))
        except ExceptionGroup as failed:  # the first failure speaks for the request
            raise failed.exceptions[0] from None
    return {qid: outcomes[qid] for qid, _ in items}
