"""Backpressure: a bounded number of decisions run, a bounded number wait, and only
what can be answered in time is admitted.

Past both bounds a request is refused at once with ``Overloaded`` (429 and
Retry-After) instead of joining an unbounded queue. Within them, a request that
says what it will take (``Work``: the tokens its plan evaluates and the seconds
they take on an idle server, from ``proxy/cost.py``) is refused at once when it
cannot finish within its deadline: with a client error (``InvalidRequest``,
``exceeds_deadline``) naming the estimate when it could not even on an idle
server, with 429 and a Retry-After when the work admitted ahead of it is what
stands in the way (``turns_s`` and ``finish_s``: the requests ahead take
llama-server's slots in turn, and llama-server shares the CPU among the slots it
evaluates). Beside other work, a decision is admitted only when its estimate
finishes within 80% of its deadline and before any decision admitted earlier
must finish by that rule (``budget_s``): a later decision lengthens the earlier
ones in llama-server's slots, so a burst must not spend their margin. A
request that says nothing (its model not yet measured) is judged as before: the
queue ahead of it and the measured time per decision (``estimated_finish_s``).
Each admitted decision runs under the deadline; when it passes, the work is
cancelled (which closes its llama-server connections, so llama-server stops too)
and the request gets ``UpstreamTimeout`` (504). The deadline is each request's own
(``Deadline``, proxy/deadlines.py: the server's unless the request asked for another),
and so are the refusal at once and the timeout judged by it.

The places are an ``asyncio.Semaphore``'s and the deadline is ``asyncio.timeout``'s
(bench/investigations/primitives.py times them against the hand-written versions
they replaced).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator

from .deadlines import Deadline
from .errors import InvalidRequest, Overloaded, UpstreamTimeout
from .facts import Facts
from .queueing import Work, estimated_finish_s, finish_s, smoothed, turns_s

__all__ = ["Admission", "Work", "server_timing"]


_HEADROOM = 0.8  # admit only what the estimate finishes within this share of the deadline


def server_timing(estimate: tuple[Work, float] | None) -> str | None:
    """The ``Server-Timing`` header value that reports an admission estimate (``Facts.
    estimate``: the work and the seconds until the answer; RFC-less but W3C Server
    Timing's syntax), or None when there was none."""
    if estimate is None:
        return None
    work, finish = estimate
    return (
        f'semif-estimate;dur={finish * 1000:.0f};desc="{work.tokens} prompt tokens, '
        f'{work.seconds:.3f} s idle"'
    )


def _undone(work: Work, evaluated: int) -> float:
    """The seconds of ``work`` left once ``evaluated`` of its tokens were: its share of
    the tokens not evaluated yet (all of it while none were, none once all were; a
    decision's last one-token read is in ``work.tokens`` too)."""
    if work.tokens <= 0:
        return work.seconds
    return work.seconds * max(0.0, 1.0 - evaluated / work.tokens)


class Admission:
    """At most ``max_active`` admitted decisions run at once, each holding one of the
    admission's places (``asyncio.Semaphore``: its waiters are served first come, first
    served, a released place goes to the first of them, and one cancelled as it was
    handed a place passes it on); at most ``max_queued`` more wait for one. ``deadline_s``:
    the deadline of a request that brings none of its own."""

    def __init__(self, *, max_active: int, max_queued: int, deadline_s: float, retry_after_s: int):
        if max_active < 1 or max_queued < 0:
            raise ValueError("max_active must be >= 1 and max_queued >= 0")
        self._places = asyncio.Semaphore(max_active)
        # our own counts of the semaphore's holders and waiters (it exposes neither): the
        # bounds, the estimates and the gauges read them
        self._active = 0
        self._queued = 0
        self._max_active = max_active
        self._max_queued = max_queued
        self._deadline = Deadline(deadline_s, deadline_s)
        self._retry_after_s = retry_after_s
        self.parallel = max_active  # decisions served at once: at most llama-server's slots
        self._slot_counts: dict[object, int] = {}  # slots by whose they are (limit_parallel)
        self.decision_s: float | None = None  # measured time per decision, once known
        # requests that said what they take, admitted decisions and relayed requests
        # apart: ticket -> (what it takes, admitted at, its request's facts and the prompt
        # tokens they counted as evaluated before (``Facts.evaluated``: its reads add to
        # them), its deadline's seconds)
        self._work: dict[object, tuple[Work, float, Facts, int, float]] = {}
        self._relayed: dict[object, tuple[float, float, float, float | None]] = {}

    def ahead(self, now: float | None = None, *, paced: bool = False) -> list[float]:
        """The seconds of work each admitted request has left, as far as known: its work
        less the share of its estimated finish that has passed (a request admitted
        without an estimate counts as one measured decision). ``paced``: for a decision,
        while other decisions are admitted, whose prompts llama-server evaluates beside
        the generations, a relayed generation counts as long as it will then hold its slot
        (``Work.paced_s``); a decision admitted beside generations alone finds them at
        their own pace (its own prompt slows those beside it, not its wait for a slot)."""
        decisions, relayed = self._ahead(now, paced)
        return [*decisions, *relayed]

    def _ahead(self, now: float | None, paced: bool) -> tuple[list[float], list[float]]:
        """``ahead``'s seconds, the decisions' and the relayed requests' apart."""
        now = time.monotonic() if now is None else now
        paced = paced and bool(self._work)  # paced by the prompts of decisions admitted

        def left(w: float, since: float, finish: float) -> float:
            return w * max(0.0, 1.0 - (now - since) / finish) if finish > 0 else 0.0

        # a decision by the share of its tokens not evaluated yet: llama-server evaluates
        # the prompts in its slots in the same batches, so a decision's own estimate of
        # when it finishes says little about how far it is (a long prompt estimated at
        # 13 s finished with the short ones beside it, 40 s later)
        decisions = [
            _undone(work, facts.evaluated - before)
            for work, _since, facts, before, _d in self._work.values()
        ]
        unknown = self._active + self._queued - len(self._work)
        if unknown > 0 and self.decision_s is not None:
            decisions += [self.decision_s] * unknown
        relayed = [
            left(w, since, f) if not paced or p is None else left(*self._paced(w, since, p))
            for w, since, f, p in self._relayed.values()
        ]
        return decisions, relayed

    def _decision_finish_s(self, work_s: float) -> float:
        """When a decision of ``work_s`` admitted now is answered: among the decisions
        ahead, in turns (``turns_s``: llama-server evaluates the prompts in its slots in
        the same batches, so they finish together); that time is then its work beside the
        relayed generations, which share the CPU (``finish_s``)."""
        decisions, relayed = self._ahead(None, True)
        among = turns_s(work_s, decisions, self.parallel)
        return finish_s(among, relayed, self.parallel) if relayed else among

    def _paced(self, work_s: float, since: float, paced_s: float) -> tuple[float, float, float]:
        """A relayed generation as a decision sees it: it holds its slot ``paced_s`` of wall
        time however the CPU is shared, which ``finish_s`` (processor sharing among the
        slots) reads as ``paced_s / slots`` of work; never less than its own work."""
        equivalent = max(work_s, paced_s / self.parallel)
        return equivalent, since, paced_s

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def active(self) -> int:
        return self._active

    def budget_s(self, now: float | None = None, deadline_s: float | None = None) -> float:
        """The latest finish, in seconds from now, at which a decision with a deadline of
        ``deadline_s`` (None: the server's) is admitted beside the work admitted already:
        ``_HEADROOM`` of its deadline (a margin for the estimate's error), and no later than
        any decision admitted before it may finish by the same rule (by its own deadline).
        A decision admitted later lengthens the ones in llama-server's slots before it
        (their prompts are evaluated in the same batches, and a decision's last read joins
        whatever batch comes next), and all of them are done when all the admitted work
        is, which is when this one is estimated to finish: so no admission
        pushes an earlier one past its deadline (a burst of decisions alone had 7 of 13
        admitted ones end in 504 without this). Never less than half the shortest deadline
        among it and those admitted: a decision estimated to finish within that is admitted
        (the issue's rule: no refusal under half the deadline), since the earlier ones are
        mostly done first; a long deadline beside short ones does not widen that floor, or
        it would push them past theirs."""
        now = time.monotonic() if now is None else now
        deadline_s = self._deadline.seconds if deadline_s is None else deadline_s
        budget, shortest = deadline_s * _HEADROOM, deadline_s
        for _work, since, _facts, _before, theirs in self._work.values():
            budget = min(budget, theirs * _HEADROOM - (now - since))
            shortest = min(shortest, theirs)
        return max(budget, shortest / 2)

    def _too_late(self, finish: float, budget: float, what: str, deadline_s: float) -> Overloaded:
        """The 429 for a request estimated to finish in ``finish`` s against ``budget``,
        under a deadline of ``deadline_s``."""
        if finish <= deadline_s * _HEADROOM:
            limit = f"the {budget:.0f} s it may take beside the decisions admitted before it"
        else:
            limit = (
                f"the {deadline_s * _HEADROOM:.0f} s admitted within its "
                f"{deadline_s:g} s deadline (a margin for the estimate's error)"
            )
        return Overloaded(
            f"{what}, it would finish in about {finish:.0f} s, past {limit}; retry later",
            retry_after_s=max(1, math.ceil(finish - budget)),
        )

    def crowded(self, deadline: Deadline | None = None) -> None:
        """Refuse at once (429), before a request is even planned, when the work admitted
        already keeps any request arriving now past its budget (``budget_s``, by its
        ``deadline``; None: the server's). Planning a decision asks llama-server to render
        and tokenise its prompt: a burst must not pile that onto a server it already fills
        (256 requests at once waited 55 s for their refusals)."""
        if not self._work and not self._relayed:
            return
        seconds = (deadline or self._deadline).seconds
        finish = self._decision_finish_s(0.0)
        budget = self.budget_s(deadline_s=seconds)
        if finish > budget:
            raise self._too_late(
                finish, budget, "with the work admitted ahead of this request", seconds
            )

    def admit(
        self,
        work: Work | None = None,
        deadline: Deadline | None = None,
        facts: Facts | None = None,
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Run the block once a place is free, within the ``deadline`` (None: the server's;
        counted from this call, so time spent queued counts). ``work``: what the request
        will take, when known. ``facts``: the request's (proxy/facts.py): the estimate it
        is admitted with is written there, and its reads count there the tokens they
        evaluated and the time they waited for a llama-server slot."""
        facts = facts or Facts()
        deadline = deadline or self._deadline
        seconds = deadline.seconds
        # every place taken and the queue full (counted together: a place handed to a
        # waiter counts as queued until the waiter runs)
        if self._active + self._queued >= self._max_active + self._max_queued:
            raise Overloaded(
                "too many decisions in flight and queued; retry later",
                retry_after_s=self._retry_after_s,
            )
        if work is not None:
            if work.seconds > seconds:
                raise InvalidRequest(
                    f"this request needs {work.describe()}; {deadline.describe()}: send a "
                    f"shorter conversation or fewer options, {deadline.longer()}",
                    code="exceeds_deadline",
                )
            finish = self._decision_finish_s(work.seconds)
            if self._work or self._relayed:  # alone, it is judged by its deadline only
                budget = self.budget_s(deadline_s=seconds)
                if finish > budget:
                    raise self._too_late(
                        finish,
                        budget,
                        f"this request needs {work.describe()}; with the work admitted ahead of it",
                        seconds,
                    )
            facts.estimate = (work, finish)
            return self._admitted(work, seconds, facts)
        if self.decision_s is not None:
            finish = estimated_finish_s(self._queued, self._active, self.parallel, self.decision_s)
            budget = seconds * _HEADROOM
            if finish > budget:
                raise Overloaded(
                    f"the decisions queued ahead would take about {finish:.1f} s, past this "
                    f"request's {seconds:g} s deadline; retry later",
                    retry_after_s=max(1, math.ceil(finish - budget)),
                )
        return self._admitted(None, seconds, facts)

    @contextlib.asynccontextmanager
    async def _admitted(
        self, work: Work | None, deadline_s: float, facts: Facts
    ) -> AsyncIterator[None]:
        """A place, and the deadline around waiting for it and the block. A cancel (the
        deadline's or the client's) while queued takes no place or passes on the one it
        was handed (the semaphore's part); one while holding gives it back once."""
        ticket = object()
        if work is not None:
            self._work[ticket] = (work, time.monotonic(), facts, facts.evaluated, deadline_s)
        deadline = asyncio.timeout(deadline_s)
        try:
            async with deadline:
                self._queued += 1
                try:
                    await self._places.acquire()  # at once when a place is free
                finally:
                    self._queued -= 1
                self._active += 1
                waited_before = facts.slot_wait_s
                started = time.monotonic()
                try:
                    yield
                finally:
                    self._active -= 1
                    self._places.release()
                # only answered decisions teach how long one takes to serve (not when the
                # waits of parallel questions overlap past the whole)
                served = time.monotonic() - started - (facts.slot_wait_s - waited_before)
                if served > 0:
                    self._measured(served)
        except TimeoutError as exc:
            if deadline.expired():  # ours, not a timeout of the work's own
                raise UpstreamTimeout(
                    f"the decision did not finish within the {deadline_s:g} s deadline"
                ) from exc
            raise
        finally:
            self._work.pop(ticket, None)

    @contextlib.asynccontextmanager
    async def relayed(self, work: Work | None, timeout_s: float) -> AsyncIterator[None]:
        """Count a relayed request's work (a generation, a chat answer) as admitted while
        it runs, so that decisions see the CPU it takes; never cut by the decision deadline
        (its length is bounded by --relay-max-tokens instead). Refused at once (429) when
        the work ahead would keep its first token (``Work.first_s``; all of it when that
        is None: a whole answer of a length the client named) from coming within
        ``timeout_s``, the time the proxy waits for llama-server's answer."""
        if work is None:
            yield
            return
        first = work.seconds if work.first_s is None else work.first_s
        start = finish_s(first, self.ahead(), self.parallel)
        if start > timeout_s:
            what = (
                "would finish in about"
                if work.first_s is None
                else "would wait for its first token about"
            )
            raise Overloaded(
                f"this generation {what} {start:.0f} s behind the work admitted ahead of "
                f"it, past the {timeout_s:g} s the proxy waits for llama-server; retry later",
                retry_after_s=max(1, math.ceil(start - first)),
            )
        ticket = object()
        self._relayed[ticket] = (work.seconds, time.monotonic(), work.seconds, work.paced_s)
        try:
            yield
        finally:
            del self._relayed[ticket]

    def limit_parallel(self, slots: int, owner: object = None) -> None:
        """Decisions beyond ``slots`` wait for a llama-server slot (proxy/kv.py) however
        many are admitted: estimate with that many served at once. ``owner``: whose slots
        they are; behind a llama-server router each model has its own, and one admission
        serves them all at once (the measured decision time is one for all models)."""
        self._slot_counts[owner] = slots
        self.parallel = max(1, min(self._max_active, sum(self._slot_counts.values())))

    def _measured(self, seconds: float) -> None:
        self.decision_s = smoothed(self.decision_s, seconds)
