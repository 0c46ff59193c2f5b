"""Repeatable reads on llama-server's slots.

The reader owns the slot book (``proxy/kv.py``: which slots the proxy leases and
what each holds canonically) and evaluates every prompt the canonical way there, so
that a replay reads the same numbers. Each ``/completion`` step that ran alone is
timed for the cost model (``proxy/cost.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from .admission import Admission
from .cost import CostModel, kind_of
from .discovery import Discovery
from .facts import Facts
from .kv import (
    LONE_ROW_CELLS,
    MAX_SMALL_CHUNK,
    SlotBook,
    SlotContent,
    Step,
    after,
    common_prefix,
    lone_last,
    steps_at,
)
from .metrics import Metrics
from .upstream import Completion, NextToken, Upstream

__all__ = ["Reader", "short"]

log = logging.getLogger("proxy")


def short(prompt: Sequence[int], ubatch: int) -> bool:
    """Whether a read of ``prompt`` is one request that any slot content reads the same:
    the prefix scheme's prompts of at most 256 tokens (a ``kv.SlotBook`` short lease)."""
    return ubatch > 0 and len(prompt) <= LONE_ROW_CELLS


def _found(sent: tuple[int, ...], s_len: int, done: Completion, ubatch: int) -> SlotContent | None:
    """What a slot holds after a request that reused other than its plan said (someone
    else's request changed the slot): on the prefix scheme, when what it reused lies within
    the first 256 cells, ``sent``, each row canonical (no row there goes through another
    kernel, whoever evaluated it; the rows it evaluated itself as any request does, its
    last alone past 256 cells when it went alone); else unknown (None)."""
    got = Step(len(sent), True, done.cached, done.read.prompt_evaluated)
    if not ubatch or got.cached > LONE_ROW_CELLS or got.cached + got.evaluated != got.length:
        return None
    return SlotContent(sent, s_len, lone_last(got, ubatch))


class Reader:
    """``ubatch``: llama-server's physical batch, when known and small enough for the
    prefix scheme; 0: the segment scheme. ``on_fresh`` is called when the slots are first
    counted and whenever llama-server came back (its slots are then new)."""

    def __init__(
        self,
        upstream: Upstream,
        discovery: Discovery,
        *,
        ubatch: int,
        admission: Admission,
        metrics: Metrics | None,
        on_fresh: Callable[[], None],
    ):
        self._upstream = upstream
        self._discovery = discovery
        self.ubatch = ubatch if 2 <= ubatch <= MAX_SMALL_CHUNK else 0
        self._admission = admission
        self._metrics = metrics
        self._on_fresh = on_fresh
        self._epoch = upstream.epoch
        self._book: SlotBook | None = None  # llama-server's slots, once counted
        self.cost = CostModel()  # what a step costs on this llama-server (proxy/cost.py)
        self._steps_running = self._steps_started = 0  # this reader's /completion calls

    @property
    def scheme(self) -> str:
        """How prompts are evaluated (proxy/kv.py): ``prefix-<ub>`` or ``segment``."""
        return f"prefix-{self.ubatch}" if self.ubatch else "segment"

    async def book(self, facts: Facts | None = None) -> SlotBook:
        """The slot book, made when the slots are first counted (``facts``: the request's
        that waits for the count, proxy/facts.py)."""
        if self._book is None:
            total = await self._discovery.total_slots(facts)
            if self._book is None:  # the first to get here after the await makes it
                self._book = SlotBook(list(range(total)))
                self._epoch = self._upstream.epoch  # loading seen before
                self._admission.limit_parallel(self._book.size, self)
                lanes = self._upstream.lanes
                lanes.follow_slots(self._book.size, self)
                self._book.depth = lanes.per_slot
                self._on_fresh()
        epoch = self._upstream.epoch
        if epoch != self._epoch:  # llama-server came back: its slots and kernels are new
            self._epoch = epoch
            self._book.forget()
            self._on_fresh()
        return self._book

    def forget(self) -> None:
        """Nothing any slot holds is known any more (the book is kept: decisions in
        flight hold its leases)."""
        if self._book is not None:
            self._book.forget()

    async def read(
        self,
        book: SlotBook,
        slot: int,
        prompt: tuple[int, ...],
        s_len: int,
        width: int,
        ubatch: int,
        *,
        teach: bool = True,
        facts: Facts | None = None,
    ) -> tuple[NextToken, int]:
        """Read the next token after ``prompt`` evaluated the canonical way (``kv.steps_at``),
        and the tokens evaluated for it (``teach``: whether its steps may teach the cost
        model; a start-up read that llama-server may have batched with another process's
        work does not, lest it be the only step the model has seen). A slot found changed
        under the read (llama-server reused other than expected) starts it again: the
        prefix scheme on what that request left when it reused no more than the first 256
        cells (``_found``), else from a cold shared segment; if that happens twice, the read
        is made as it comes and counted as unrepeatable.

        The prefix scheme keeps the work of a read cut short (a deadline, a client gone):
        the slot holds some prefix of what was sent, each row canonical, so the next read
        there reads on whatever llama-server reuses of it (``_resume``), and reads the last
        token again alone when it did not go alone the first time.

        ``facts``: the request's the read is for (proxy/facts.py), where each step counts
        the tokens it evaluated and its time waiting on llama-server."""
        if short(prompt, ubatch):
            return await self._read_short(book, slot, prompt, s_len, width, teach, facts)
        spent = restarts = 0
        held = book.contents[slot]
        if ubatch and held is not None and held.partial:
            read, spent = await self._resume(book, slot, held, prompt, width, ubatch, facts)
            if read is not None:
                return read, spent
        while restarts < 2:
            steps = steps_at(book.contents[slot], prompt, s_len, ubatch)
            for step in steps:
                sent = after(step, prompt)
                last = step is steps[-1]
                try:
                    done = await self.complete(
                        sent,
                        slot=slot,
                        cache=step.cache,
                        n_probs=width if last else 0,
                        teach=teach,
                        facts=facts,
                    )
                except BaseException:
                    if ubatch:  # what was evaluated stays for a retry (kv.SlotContent.partial)
                        book.contents[slot] = SlotContent(
                            sent, 0, lone_last(step, ubatch), partial=True
                        )
                    raise
                spent += done.read.prompt_evaluated
                if (done.cached, done.read.prompt_evaluated) != (step.cached, step.evaluated):
                    book.contents[slot] = _found(sent, s_len, done, ubatch)
                    restarts += 1
                    break
                book.contents[slot] = SlotContent(
                    sent, s_len, ubatch > 0 and lone_last(step, ubatch)
                )
            else:
                return done.read, spent
        done = await self.complete(prompt, slot=slot, cache=True, n_probs=width, facts=facts)
        book.contents[slot] = None
        log.warning(
            "llama-server slot %d kept changing under a read (reused %d of %d "
            "tokens): this answer may differ from a replay",
            slot,
            done.cached,
            len(prompt),
        )
        if self._metrics:
            self._metrics.unrepeatable_reads.inc()
        return done.read, spent + done.read.prompt_evaluated

    async def _read_short(
        self,
        book: SlotBook,
        slot: int,
        prompt: tuple[int, ...],
        s_len: int,
        width: int,
        teach: bool = True,
        facts: Facts | None = None,
    ) -> tuple[NextToken, int]:
        """A prompt of at most 256 tokens on the prefix scheme: one request that reuses
        whatever prefix the slot holds, the last row included in the per-row kernel. No
        row within the first 256 cells goes through another kernel, whoever evaluated it
        (docs/repeatability.md), so the read is canonical whatever llama-server reuses:
        nothing is checked, and it may have waited behind another read of the slot."""
        try:
            done = await self.complete(
                prompt, slot=slot, cache=True, n_probs=width, teach=teach, facts=facts
            )
        except BaseException:
            book.contents[slot] = SlotContent(prompt, 0, partial=True)
            raise
        whole = done.cached + done.read.prompt_evaluated == len(prompt)
        book.contents[slot] = SlotContent(prompt, s_len) if whole else None
        return done.read, done.read.prompt_evaluated

    async def _resume(
        self,
        book: SlotBook,
        slot: int,
        held: SlotContent,
        prompt: tuple[int, ...],
        width: int,
        ubatch: int,
        facts: Facts | None,
    ) -> tuple[NextToken | None, int]:
        """After a read cut short in ``slot``: read after ``prompt`` on whatever the slot
        kept, and record what it then holds. The read when its last row went alone (or the
        prompt fits the first 256 cells), as the canonical plan's does, else None; and the
        tokens evaluated."""
        try:
            done = await self.complete(prompt, slot=slot, cache=True, n_probs=width, facts=facts)
        except BaseException:
            book.contents[slot] = SlotContent(
                prompt, 0, lone_last(Step(len(prompt), True, 0, 1), ubatch), partial=True
            )
            raise
        n = len(prompt)
        got = Step(n, True, done.cached, done.read.prompt_evaluated)
        if got.cached > common_prefix(held.tokens, prompt) or got.cached + got.evaluated != n:
            book.contents[slot] = None  # more than was left there: someone else's rows
            return None, got.evaluated
        book.contents[slot] = SlotContent(prompt, 0, lone_last(got, ubatch))
        alone = n <= LONE_ROW_CELLS or book.contents[slot].lone_last
        return (done.read if alone else None), got.evaluated

    async def complete(
        self,
        tokens: Sequence[int],
        *,
        slot: int,
        cache: bool,
        n_probs: int = 0,
        teach: bool = True,
        facts: Facts | None = None,
    ) -> Completion:
        """``Upstream.complete``, timed: a step no other step of this reader ran beside
        teaches the cost model what such a step costs (unless ``teach`` is False). The
        tokens it evaluated count in ``facts`` (how far the admitted decision is)."""
        alone = self._steps_running == 0
        self._steps_running += 1
        self._steps_started += 1
        mark = self._steps_started
        started = time.monotonic()
        try:
            done = await self._upstream.complete(
                tokens, slot=slot, cache=cache, n_probs=n_probs, facts=facts
            )
        finally:
            self._steps_running -= 1
        if facts is not None:
            facts.evaluated += done.read.prompt_evaluated
        if teach and alone and mark == self._steps_started and done.seconds > 0:
            evaluated = done.read.prompt_evaluated
            self.cost.observe(
                kind_of(evaluated, self.ubatch),
                evaluated,
                done.cached,
                done.seconds,
                time.monotonic() - started,
            )
        return done
