"""When admitted work finishes: what a request's work is (``Work``) and the pure formulas
admission judges by (proxy/admission.py).

Each takes the seconds of work a request brings and those of the requests ahead of it,
and models how llama-server's slots serve them: in turns, the prompts in the slots at
once finishing together (``turns_s``), or sharing the CPU among the slots (``finish_s``,
processor sharing), or, while no request says what it takes, a FIFO queue of measured
decisions (``estimated_finish_s``, with ``smoothed`` the measured mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Work", "estimated_finish_s", "finish_s", "smoothed", "turns_s"]


@dataclass(frozen=True)
class Work:
    """What an admitted request will take: the prompt tokens its plan evaluates and the
    seconds its steps take on an idle llama-server."""

    tokens: int
    seconds: float
    # seconds until its first token on an idle server, when less than all of it (a relayed
    # generation, whose ``seconds`` count every token it may generate): what its own
    # refusal is judged by
    first_s: float | None = None
    # seconds a relayed generation holds its llama-server slot while a decision's prompt
    # is evaluated beside it: each token waits for one llama-server iteration, which then
    # carries a chunk of that prompt too (what a decision admitted behind it waits for)
    paced_s: float | None = None

    def describe(self) -> str:
        return f"about {self.tokens:,} prompt tokens, about {self.seconds:.0f} s on this server"


_SMOOTHING = 0.2  # weight of the newest decision in the moving average of decision time


def finish_s(work_s: float, ahead: list[float], slots: int) -> float:
    """Seconds until a request of ``work_s`` admitted now is answered, when the requests
    ``ahead`` (in the order they were admitted) still have that many seconds of work
    each: they take the ``slots`` llama-server slots first come, first served, and the
    CPU is shared evenly among those in a slot (processor sharing). Each admitted
    request in a slot delays this one by as much of its work as runs beside it; one
    still waiting for a slot delays it by all of its own, once the slots are all
    taken."""
    jobs = [*ahead, work_s]
    running, waiting = jobs[:slots], jobs[slots:]
    mine = len(jobs) - 1  # this request's index: the last
    ids = list(range(len(running)))
    next_id = len(running)
    clock = 0.0
    while True:
        least = min(running)
        clock += least * len(running)
        left = [(i, r - least) for i, r in zip(ids, running)]
        if any(i == mine and r <= 1e-12 for i, r in left):
            return clock
        kept = [(i, r) for i, r in left if r > 1e-12]
        while len(kept) < slots and waiting:
            kept.append((next_id, waiting.pop(0)))
            next_id += 1
        ids, running = [i for i, _ in kept], [r for _, r in kept]


def turns_s(work_s: float, ahead: list[float], slots: int) -> float:
    """Seconds until a decision of ``work_s`` admitted now is answered behind the decisions
    ``ahead`` (in the order admitted, each with that much work left), when they take the
    ``slots`` slots in turns and the ones in the slots at once finish together, when all
    their work is done: llama-server evaluates the prompts its slots hold in the same
    batches, so a 128-token read beside a 1,400-token one finished with it, 14 s later
    (bench/admission.py's burst; its "four at once" estimates erred by -58% under
    processor sharing, ``finish_s``, for the same reason)."""
    jobs = [*ahead, work_s]
    step = max(1, slots)
    return sum(sum(jobs[first : first + step]) for first in range(0, len(jobs), step))


def estimated_finish_s(queued: int, active: int, parallel: int, decision_s: float) -> float:
    """Seconds until a request arriving now would be answered, in a FIFO queue served
    ``parallel`` at a time at ``decision_s`` each. ``active`` admitted decisions beyond
    ``parallel`` (waiting for a llama-server slot) wait like the ``queued`` ones. With
    one free, ``decision_s``; otherwise it waits for ``waiting + 1`` turns, ``parallel``
    per round of ``decision_s``, ``ceil((waiting + 1) / parallel) * decision_s``, then
    takes ``decision_s`` (whole rounds: exact when decisions start together, as in a
    burst, and on the safe side otherwise)."""
    if active < parallel:
        return decision_s
    waiting = queued + active - parallel
    return math.ceil((waiting + 1) / parallel) * decision_s + decision_s


def smoothed(mean_s: float | None, sample_s: float) -> float:
    """The exponential moving average ``(1 - a) * mean + a * sample`` (a = 0.2); the
    first sample stands alone."""
    return sample_s if mean_s is None else (1 - _SMOOTHING) * mean_s + _SMOOTHING * sample_s
