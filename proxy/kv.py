"""Repeatable reads: every decision's prompt is evaluated the same way, whatever
llama-server's caches held before it (docs/repeatability.md).

llama.cpp's CPU flash attention computes a token's row with one of three kernels,
chosen by how many tokens are evaluated together: 64 or more, a tiled kernel in
F32; 2 to 63 (or 1 with under 512 KV cells), a per-row kernel that accumulates
in F16; one token with 512 cells or more, a split-KV kernel. Within one kernel a
row's numbers depend only on the rows before it, so the chunking of a prompt
matters only through which kernel each row went through. A read is therefore
repeatable when every row of its prompt ``P = S + Q`` (``S`` the shared segment:
the template's header and the conversation or state; ``Q`` the question, its
options and the answer position) always goes through the same kernel:

- ``S`` is evaluated cold, from position 0 (``cache_prompt: false``), unless the
  slot is known to hold exactly this ``S`` from an earlier cold evaluation;
- the rows of ``Q`` but the last in chunks of 2 to 63 tokens;
- the last token alone, which is also what llama-server does when the whole
  prompt is already cached (it evaluates the last token again).

Each request is pinned to a slot (``id_slot``) that this process leases to one
decision at a time and whose content it tracks (``SlotBook``). llama-server
reports what it reused (``timings.cache_n``): a slot someone else changed shows
as an unexpected count, and the read starts again from a cold ``S``.

That is the **segment** scheme (``plan``), which holds whatever llama-server's
physical batch (``-ub``). With ``-ub`` of at most 63 no row ever goes through the
tiled kernel, and a row's numbers depend only on the rows before it, however the
prompt was cut into requests, with one exception: a row evaluated alone while the
slot holds more than 256 cells (the split-KV kernel). The **prefix** scheme
(``plan_prefix``) relies on that: any prefix llama-server reuses is as good as a
cold one, so a new conversation is one request (two when it is longer than 256
tokens: all but its last token, then the last alone, as a replay reads it), and the
template's opening, a system turn, a classifier's fixed part or a System One state
are reused wherever a slot holds them. The proxy only keeps the lone rows out: the
last row of a long read (kept out of a longer prompt's prefix), and a request's
last physical batch of one token. A prompt of at most 256 tokens has no row outside
the per-row kernel whatever its slot holds, so its one request is not checked
against the slot's record and may queue behind another such read (``SlotBook.depth``).

Longer than 400 lines on purpose: the evaluation plans and the slot book that carries
them out must agree row for row on which kernel each row goes through, so the argument
above is checked against one module.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import NamedTuple

from .cost import GGML_FA_TILE_Q
from .facts import Facts

__all__ = [
    "Step",
    "SlotContent",
    "plan",
    "plan_prefix",
    "after",
    "common_prefix",
    "dropped",
    "SlotBook",
    "Placement",
    "Trail",
    "steps_at",
    "OWN",
    "ASIDE",
    "MAX_SMALL_CHUNK",
    "LONE_ROW_CELLS",
    "N_BATCH",
    "lone_last",
]

MAX_SMALL_CHUNK = GGML_FA_TILE_Q - 1
"""The largest chunk of the per-row kernel: ``GGML_FA_TILE_Q - 1`` (63), one token short of
llama.cpp's flash-attention tile (``proxy/cost.py`` owns it); also the largest physical
batch (``-ub``) of the prefix scheme."""
# A row evaluated alone goes through the per-row kernel while the slot's KV cells (padded
# to 256) are fewer than 512: at most this many tokens up to and including the row.
LONE_ROW_CELLS = 256
N_BATCH = 2048  # llama-server's logical batch (-b): a request is decoded in pieces of it
# A decision waits for a leased slot that will hold at least this many tokens more of its
# prompt than any free slot holds (the segment scheme: its whole segment), rather than
# evaluate them again beside it, while the reads queued for that slot (each costing about
# what this one's own part does, plus READ_TOKENS) evaluate fewer tokens than it would
# evaluate again: 16 questions sent at once about one 1,600-token state evaluate it once;
# a classifier's 200-token fixed part before 100-token tickets is waited for once, then
# evaluated in a second slot, and so on until every slot holds it.
WAIT_FOR_PREFIX = 128
READ_TOKENS = 16  # a one-token read costs about as much as evaluating this many tokens


def _worth_waiting(more: int, own: int, sharers: int) -> bool:
    """Whether a read that leaves ``more`` tokens of a prompt than any free slot holds is
    worth waiting for, by ``sharers`` reads (the first among them) each evaluating about
    ``own`` tokens there: at least ``WAIT_FOR_PREFIX`` tokens, and more than they evaluate."""
    return more >= max(WAIT_FOR_PREFIX, own * sharers)


class SlotContent(NamedTuple):
    """What a slot holds canonically: the tokens, and the length of the shared segment
    they were evaluated with (the rows of two segments of different lengths went
    through different kernels even where their tokens agree)."""

    tokens: tuple[int, ...]
    s_len: int
    lone_last: bool = False  # prefix scheme: the last row was evaluated alone past 256 cells
    # prefix scheme: a request cut short (a deadline, a client gone) left some prefix of
    # ``tokens`` in the slot, each row evaluated canonically; how many, llama-server says
    partial: bool = False


@dataclass(frozen=True)
class Step:
    """One request: the first ``length`` tokens of the prompt (the last one replaced
    by ``junk`` when set), and what llama-server must report for it."""

    length: int
    cache: bool  # cache_prompt
    cached: int  # tokens it reuses from the slot (timings.cache_n)
    evaluated: int  # tokens it evaluates (timings.prompt_n)
    junk: int | None = None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``.

    Compared a slice at a time (C loops, not a Python one per token): the whole of the
    shorter first, as a replay or a shared state matches it, else by halving the range
    that holds the first difference. Runs for each slot a decision may take."""
    if a is b:  # a replay: the prompt cache's tuple, as the slot book keeps it
        return len(a)
    if type(a) is not type(b):  # a tuple never equals a list
        a, b = tuple(a), tuple(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def dropped(kept: int, held: int, elsewhere: int) -> int:
    """The tokens of a coming decision's prompt that a read drops from a slot holding
    ``held`` of them, keeping ``kept``, while another slot (or a read in progress) holds
    ``elsewhere`` of them: what that decision will evaluate again (``SlotBook``'s pick)."""
    return max(0, held - max(kept, elsewhere))


def _has_segment(content: SlotContent, segment: tuple[int, ...]) -> bool:
    """Whether a slot holding ``content`` holds ``segment`` as its segment."""
    return content.s_len == len(segment) and content.tokens[: len(segment)] == segment


def _segment_share(segment: tuple[int, ...], content: SlotContent) -> int:
    """The segment scheme's share of what a slot holds (``content``) for a read of
    ``segment``: all of it when the slot holds that same segment, else nothing (rows of
    segments of other lengths went through other kernels)."""
    return len(segment) if _has_segment(content, segment) else 0


def plan(content: SlotContent | None, s_len: int, prompt: tuple[int, ...]) -> list[Step]:
    """The requests that leave the slot holding ``prompt`` evaluated canonically, the
    last one reading the next token. ``content``: what the slot holds canonically (this
    process's record), ``None`` when unknown. ``s_len``: the length of ``S``."""
    n = len(prompt)
    if not 0 < s_len < n:
        raise ValueError("the shared segment must be a proper, non-empty prefix")
    # what the slot holds when it holds this same segment, else None
    same = (
        content
        if (
            content is not None
            and content.s_len == s_len
            and content.tokens[:s_len] == prompt[:s_len]
        )
        else None
    )
    if same is not None and same.tokens[:n] == prompt:
        return [Step(n, True, n - 1, 1)]  # a replay: the common case
    steps: list[Step] = []
    if same is None:
        steps.append(Step(s_len, False, 0, s_len))
        held = s_len
    else:
        held = min(common_prefix(same.tokens, prompt), n)
    target = n - 1  # every row but the last
    if held >= target:
        return [*steps, Step(n, True, n - 1, 1)]
    if target - held == 1 and held > s_len:
        # a one-token chunk would take another kernel: start the chunk a token earlier,
        # after making the slot drop that token (a different token in its place). (A
        # question of two tokens has its first read alone every time: never a choice.)
        held -= 1
        other = 0 if prompt[held] != 0 else 1
        steps.append(Step(held + 1, True, held, 1, junk=other))
    rest = target - held
    pieces = math.ceil(rest / MAX_SMALL_CHUNK)
    end = held
    for i in range(pieces):
        size = rest // pieces + (1 if i < rest % pieces else 0)
        steps.append(Step(end + size, True, end, size))
        end += size
    steps.append(Step(n, True, n - 1, 1))
    return steps


def _last_piece(m: int, ubatch: int) -> int:
    """The size of the last physical batch of a request that evaluates ``m`` tokens:
    llama-server decodes it in logical batches of ``N_BATCH``, each in pieces of ``ubatch``."""
    tail = (m - 1) % N_BATCH + 1
    return (tail - 1) % ubatch + 1


def plan_prefix(content: SlotContent | None, prompt: tuple[int, ...], ubatch: int) -> list[Step]:
    """The requests that read the next token after ``prompt`` the canonical way on a
    llama-server whose physical batch is ``ubatch`` (2 to 63): every row but the last in
    pieces of 2 to ``ubatch`` from whatever prefix the slot holds (a row alone only
    within the first 256 cells), the last row alone. ``content``: what the slot holds, or
    ``None`` when unknown (then everything is evaluated from position 0)."""
    n = len(prompt)
    if n < 2:
        raise ValueError("a prompt of at least two tokens")
    if not 2 <= ubatch <= MAX_SMALL_CHUNK:
        raise ValueError("the prefix scheme needs a physical batch of 2 to 63")
    natural = 0 if content is None else common_prefix(content.tokens, prompt)
    reused = natural
    if content is not None and content.lone_last and len(content.tokens) <= natural < n:
        reused = len(content.tokens) - 1  # never build on a row evaluated alone
    if reused >= n - 1:  # a replay, or all but the last known: the last row alone
        return [Step(n, True, n - 1, 1)]
    main: list[Step] = []
    if n <= LONE_ROW_CELLS:  # every row, the last included, in the per-row kernel
        main.append(Step(n, True, reused, n - reused))
    else:
        m = n - 1 - reused
        if _last_piece(m, ubatch) == 1:  # a piece of one past 256 cells: avoid it
            if m == 1:
                reused -= 1  # the slot drops one more row: two are evaluated together
            else:
                main.append(Step(reused + 2, True, reused, 2))
        start = main[-1].length if main else reused
        main += [Step(n - 1, True, start, n - 1 - start), Step(n, True, n - 1, 1)]
    if reused == 0:  # from position 0: nothing of the slot is used
        first = main[0]
        return [Step(first.length, False, 0, first.evaluated), *main[1:]]
    if reused < natural:
        return [_drop_after(reused, prompt), *main]
    return main


def lone_last(step: Step, ubatch: int) -> bool:
    """Whether ``step`` leaves its last row evaluated alone past 256 cells (a row no
    longer prompt may build on)."""
    return step.length > LONE_ROW_CELLS and _last_piece(step.evaluated, ubatch) == 1


def _drop_after(keep: int, prompt: tuple[int, ...]) -> Step:
    """A request that leaves the slot holding ``prompt[:keep]`` and one junk token after
    it (a token other than the prompt's next), so that the next request reuses ``keep``."""
    other = 0 if prompt[keep] != 0 else 1
    return Step(keep + 1, True, keep, 1, junk=other)


def steps_at(
    held: SlotContent | None, prompt: tuple[int, ...], s_len: int, ubatch: int
) -> list[Step]:
    """The requests that read ``prompt`` in a slot holding ``held``: ``plan_prefix`` on the
    prefix scheme (``ubatch``, llama-server's physical batch), else ``plan`` (``s_len``:
    the length of the shared segment)."""
    return plan_prefix(held, prompt, ubatch) if ubatch else plan(held, s_len, prompt)


OWN, ASIDE = 0, 1  # the slots of a decision's estimate (``Trail``): its own, and another


class Placement(NamedTuple):
    """Where a read goes and what it evaluates there (``SlotBook.placement``): the slot,
    what that slot holds (what the read builds on) and the requests that read it there."""

    slot: int
    content: SlotContent | None
    steps: list[Step]

    @property
    def evaluated(self) -> int:
        """The tokens the read evaluates."""
        return sum(step.evaluated for step in self.steps)


def after(step: Step, prompt: tuple[int, ...]) -> tuple[int, ...]:
    """What the slot holds once ``step`` has run (``prompt`` itself after the last)."""
    held = prompt[: step.length]
    if step.junk is not None:
        held = (*held[:-1], step.junk)
    return held


class SlotBook:
    """llama-server's slots, each leased to one decision at a time, with what each
    holds canonically. A free slot is chosen by preference: one that holds the same
    ``S``, then one that holds nothing known, then one that holds no coming decision's
    segment, then any, the one used longest ago first (the prefix
    scheme: ``_pick_by_prefix``, the longest prefix of the prompt less what the read
    would drop there of a coming decision's prompt that no other slot holds, then the one
    used longest ago: a question's content-free read does not drop the state its next
    question reads on, unless evaluating the state again costs less than evaluating
    elsewhere what it shares with that slot). When
    every slot is leased, decisions wait in arrival order and each freed slot goes
    to the first of them. A decision also waits for one leased slot when the decision
    reading there will leave ``WAIT_FOR_PREFIX`` tokens more of this prompt in it than
    any free slot holds (the segment scheme: its whole segment, when no free slot holds
    it): shared work is done once. Such a decision is served before those in line for any
    slot, but the line is passed over at most ``size`` times in a row (then the next freed
    slot goes to its first), so streams of questions about states the slots hold delay a
    decision about something else by that many reads at most, not indefinitely
    (admission's estimate counts turns in arrival order).

    ``depth`` 2: a *short* lease (a read of one request whose numbers do not depend on
    what the slot holds: the prefix scheme's prompts of at most 256 tokens) may also
    queue behind another short lease of a busy slot, when nobody waits here. Its request
    then waits in llama-server's own queue, pinned to that slot, and starts in the same
    batch as the other slots' next reads when the batch before ends, as requests to its
    chat endpoint do; waiting here, they would reach it one by one after that batch had
    begun, each starting a smaller one (bench/fresh.py at concurrency 8)."""

    def __init__(self, slots: int | list[int], depth: int = 1):
        ids = list(range(slots)) if isinstance(slots, int) else list(slots)
        self.contents: dict[int, SlotContent | None] = dict.fromkeys(ids)
        self.depth = depth
        self._turns = dict.fromkeys(ids, 0)  # leases holding each slot: running, queued
        self._short: set[int] = set()  # slots whose leases are all short
        self._queueable: weakref.WeakSet[asyncio.Future[int]] = weakref.WeakSet()  # short waiters
        self._free = ids
        self._last_use = dict.fromkeys(ids, 0)
        self._uses = 0
        self._waiting: collections.deque[asyncio.Future[int]] = collections.deque()
        # leased slot -> what its read leaves there: the prompt (prefix scheme), the segment
        self._reading: dict[int, tuple[int, ...]] = {}
        self._waiting_for: dict[int, collections.deque[asyncio.Future[int]]] = {}
        # slots handed to their own waiters past the first in ``_waiting`` since one of
        # that line was last served: at ``size``, the next freed slot goes to the line
        self._passed = 0
        # the first prompts (segments, on the segment scheme) of decisions admitted (or
        # being admitted) that have not finished, for estimates (``base``,
        # ``base_segment``): what the slots will soon hold; and what a read should not
        # drop (``_pick_by_prefix``)
        self._coming: dict[object, tuple[int, ...]] = {}

    @property
    def size(self) -> int:
        return len(self.contents)

    def forget(self) -> None:
        """Another model or server answers: nothing held is known any more."""
        for slot in self.contents:
            self.contents[slot] = None

    def _pick(self, segment: tuple[int, ...], by_prefix: bool) -> int:
        if by_prefix:
            return self._pick_by_prefix(segment)

        # the segment itself, else an empty slot, else one holding no coming decision's
        # segment, each the one used longest ago
        coming = [c for c in self._coming.values() if c != segment]

        def rank(slot: int) -> tuple[int, int]:
            held = self.contents[slot]
            if held is None:
                return 1, self._last_use[slot]
            if _has_segment(held, segment):
                return 0, self._last_use[slot]
            kept = any(_has_segment(held, c) for c in coming)
            return 3 if kept else 2, self._last_use[slot]

        return min(self._free, key=rank)

    def _pick_by_prefix(self, prompt: tuple[int, ...]) -> int:
        """The free slot where a read of ``prompt`` evaluates fewest tokens, now and
        later: the longest prefix held (as llama-server itself chooses), less the tokens
        of a coming decision's prompt that only this slot holds (or a read in progress
        will leave) and the read would drop; then the one used longest ago. The drop is
        reckoned only for slots that could still win, so a replay or a read that extends
        what its slot holds compares nothing more."""
        kept = {}
        for slot in self._free:
            held = self.contents[slot]
            kept[slot] = common_prefix(held.tokens, prompt) if held is not None else 0
        order = sorted(self._free, key=lambda s: (-kept[s], self._last_use[s]))
        others = [other for other in self._coming.values() if other is not prompt]
        if not others:
            return order[0]
        shares: dict[tuple[int, int], int] = {}

        def share(slot: int, k: int) -> int:  # of others[k], what the slot holds
            if (slot, k) not in shares:
                held = self.contents[slot]
                shares[slot, k] = common_prefix(held.tokens, others[k]) if held else 0
            return shares[slot, k]

        def lost(slot: int) -> int:
            held = self.contents[slot]
            if held is None or len(held.tokens) <= kept[slot]:
                return 0  # nothing dropped: the read extends what the slot holds
            most = 0
            for k, other in enumerate(others):
                here = share(slot, k)
                if here <= kept[slot]:
                    continue
                kept_elsewhere = max(
                    [share(s, k) for s in self.contents if s != slot]
                    + [common_prefix(r, other) for r in self._reading.values()],
                    default=0,
                )
                most = max(most, dropped(kept[slot], here, kept_elsewhere))
            return most

        best = order[0]
        best_rank = (lost(best) - kept[best], self._last_use[best])
        for slot in order[1:]:
            if -kept[slot] > best_rank[0]:
                break  # sorted by what they keep: none after it can do better
            rank = (lost(slot) - kept[slot], self._last_use[slot])
            if rank < best_rank:
                best, best_rank = slot, rank
        return best

    def placement(self, prompt: tuple[int, ...], s_len: int, ubatch: int) -> Placement:
        """Where a read of ``prompt`` goes among the free slots and what it evaluates
        there: the slot a lease takes (``_pick``: by ``prompt`` on the prefix scheme,
        ``ubatch``; else by its segment, the first ``s_len`` tokens), what it holds, and
        the requests the reader sends there (``steps_at``). Admission's estimate asks this
        (``Trail``) rather than simulate the lease and the reader."""
        slot = self._pick(prompt if ubatch else prompt[:s_len], bool(ubatch))
        held = self.contents[slot]
        return Placement(slot, held, steps_at(held, prompt, s_len, ubatch))

    def _worth_waiting(self, prompt: tuple[int, ...], own: int | None = None) -> int | None:
        """A leased slot whose read leaves at least ``WAIT_FOR_PREFIX`` tokens more of
        ``prompt`` in it than any free slot holds (when none is free, than the slot leaving
        least), and more than the decisions already waiting for it and this one will
        evaluate there (each about this one's own part, plus ``READ_TOKENS``): the slot
        leaving most; or None: then the first free slot, or the first to be freed.

        The segment scheme (``own``: the tokens this read evaluates after its segment):
        ``prompt`` is the segment, and a slot leaves all of it or nothing (``_segment_share``)."""
        if not self._reading:  # no slot is being read: none to wait for
            return None
        segment_scheme = own is not None

        def shares(reading: tuple[int, ...]) -> int:  # of a read in progress
            if segment_scheme:
                return len(prompt) if reading == prompt else 0
            return common_prefix(reading, prompt)

        def keeps(held: SlotContent) -> int:  # of what a free slot holds
            if segment_scheme:
                return _segment_share(prompt, held)
            return common_prefix(held.tokens, prompt)

        if self._free:  # what a free slot would spare
            free = max(
                (keeps(known) for s in self._free if (known := self.contents[s]) is not None),
                default=0,
            )
        else:  # every slot leased: what any of them will hold
            free = (
                min(shares(reading) for reading in self._reading.values())
                if len(self._reading) == self.size
                else 0
            )
        best, gain = None, 0
        for slot, reading in self._reading.items():
            shared = shares(reading)
            more = shared - free
            queued = len(self._waiting_for.get(slot, ()))
            evaluated = len(prompt) - shared if own is None else own
            if _worth_waiting(more, evaluated + READ_TOKENS, queued + 1) and more > gain:
                best, gain = slot, more
        return best

    @contextlib.contextmanager
    def coming(self, prompt: tuple[int, ...]) -> Iterator[None]:
        """Within the block, ``prompt`` counts as one a slot will read (``base``) and
        one a read should not drop (``_pick_by_prefix``): a decision from the moment its
        cost is estimated until it has finished."""
        key = object()
        self._coming[key] = prompt
        try:
            yield
        finally:
            del self._coming[key]

    def base(self, prompt: tuple[int, ...]) -> SlotContent | None:
        """What a read of ``prompt`` will build on, for estimating its cost (prefix
        scheme): the slot holding most of it, unless decisions being read or coming share
        ``WAIT_FOR_PREFIX`` tokens more of it and few enough of them share it that the
        lease would wait for the one reading it (the rule of ``_worth_waiting``, with
        every other decision sharing that much counted as waiting before this one): then
        the part they share, as if already held. So 16 questions sent at once about one
        state cost the state once, not 16 times."""
        best, held = None, 0
        for h in self.contents.values():
            if h is not None and ((n := common_prefix(h.tokens, prompt)) > held or best is None):
                best, held = h, n
        if not self._coming and not self._reading:  # none to wait for (concurrency 1)
            return best
        coming = [common_prefix(other, prompt) for other in self._coming.values()]
        reading = [common_prefix(other, prompt) for other in self._reading.values()]
        shared = max(coming + reading, default=0)
        more = shared - held
        own = len(prompt) - shared + READ_TOKENS
        # the first reader and those that will wait for it (every decision is coming until
        # it has finished; a read that is not, a self-check's, counts as the first)
        sharers = max(1, sum(1 for s in coming if s >= shared))
        if _worth_waiting(more, own, sharers):
            return SlotContent(prompt[:shared], 0)
        return best

    def base_segment(self, prompt: tuple[int, ...], s_len: int) -> SlotContent | None:
        """``base`` for the segment scheme: the slot holding ``prompt``'s segment (the
        first ``s_len`` tokens) and most after it; else, when a decision being read or
        coming has the same segment and few enough of them share it that the lease would
        wait for the one reading it, the segment, as if already held. (``coming`` is given
        segments on this scheme.)"""
        segment = prompt[:s_len]
        best = max(
            (h for h in self.contents.values() if h is not None and _segment_share(segment, h)),
            default=None,
            key=lambda h: common_prefix(h.tokens, prompt),
        )
        if best is not None or (not self._coming and not self._reading):
            return best
        sharers = sum(1 for other in self._coming.values() if other == segment)
        if sharers or segment in self._reading.values():
            own = len(prompt) - s_len + READ_TOKENS
            if _worth_waiting(s_len, own, max(1, sharers)):
                return SlotContent(segment, s_len)
        return None

    def holding(self, segment: tuple[int, ...]) -> int:
        """How many slots hold ``segment`` as their segment (the segment scheme)."""
        return sum(
            1 for h in self.contents.values() if h is not None and _segment_share(segment, h)
        )

    def trail(self, ubatch: int, fanned_out: int = 0) -> Trail:
        """A decision's reads, placed one after another as this book will place them
        (``Trail``), for admission's estimate of what they evaluate."""
        return Trail(self, ubatch, fanned_out)

    def _behind(self, segment: tuple[int, ...], awaited: int | None) -> int | None:
        """A busy slot a short lease may queue behind (``depth``): ``awaited`` when it
        has room, else the one with fewest leases, sharing most of ``segment``, used
        longest ago; or None."""
        room = [s for s in self._short if self._turns[s] < self.depth]
        if awaited is not None:
            return awaited if awaited in room else None
        return min(
            room,
            key=lambda s: (
                self._turns[s],
                -common_prefix(self._reading.get(s, ()), segment),
                self._last_use[s],
            ),
            default=None,
        )

    def _next_line(self, slot: int) -> collections.deque[asyncio.Future[int]] | None:
        """The line ``slot`` goes to next, its first still waiting: the decisions waiting
        for what it holds, unless those in line for any slot have been passed over
        ``size`` times in a row; None when nobody waits for it."""
        own = self._waiting_for.get(slot)
        while own and own[0].done():
            own.popleft()
        while self._waiting and self._waiting[0].done():
            self._waiting.popleft()
        if not self._waiting:
            self._passed = 0
        if own and (not self._waiting or self._passed < self.size):
            return own
        return self._waiting or None

    def _hand(self, line: collections.deque[asyncio.Future[int]], slot: int) -> None:
        if line is self._waiting:
            self._passed = 0
        elif self._waiting:
            self._passed += 1
        line.popleft().set_result(slot)

    def _release(self, slot: int) -> None:
        if self._turns[slot] > 1:  # a short lease queued behind still holds it
            self._turns[slot] -= 1
            # room behind it again: for the first of the next line, when a short lease
            line = self._next_line(slot)
            if line and line[0] in self._queueable:
                self._turns[slot] += 1
                self._hand(line, slot)
            return
        self._uses += 1
        self._last_use[slot] = self._uses
        self._reading.pop(slot, None)
        self._short.discard(slot)  # until its next lease says what it is
        line = self._next_line(slot)
        if line:  # to a decision waiting for what it holds, or the first in line
            self._hand(line, slot)
            return
        self._turns[slot] = 0
        self._free.append(slot)

    def lease(
        self,
        segment: tuple[int, ...],
        *,
        by_prefix: bool = False,
        short: bool = False,
        own: int = 0,
        wait: bool = True,
        facts: Facts | None = None,
    ) -> _Lease:
        """``async with book.lease(segment) as slot:`` a slot for one decision: one that
        holds ``segment`` (the segment scheme) or, ``by_prefix``, the longest prefix of
        ``segment`` (then the prompt), else as the class says (``_pick``); or a leased one
        that is reading it, when that is worth waiting for (``_worth_waiting``; ``own``:
        on the segment scheme, the tokens the read evaluates after the segment; ``wait``
        False: never). ``short``: a read of one request that any slot content reads the
        same (see ``depth``). ``facts``: the request's, where the time spent waiting for
        the slot is counted (``Facts.slot_wait_s``)."""
        return _Lease(self, segment, by_prefix, short, own, wait, facts)


class Trail:
    """One decision's reads placed in turn before any is made, for admission's estimate
    (``place``: where each goes and what it evaluates there). ``ubatch``: the prefix
    scheme's physical batch, 0 on the segment scheme. ``fanned_out``: questions after the
    first read at once, each in a slot of its own (a fan-out on the segment scheme).

    The first read builds on what the book says it will (``SlotBook.base``,
    ``base_segment``: the slot holding most of it, or the read it will wait for); that
    slot is the decision's own (``OWN``), and each next read goes where the one before
    left it, except that the questions of a fan-out beyond the slots holding the first's
    segment (its own, at least) begin in a slot without it, and that a content-free read
    goes where ``SlotBook.placement`` puts it between the decision's own slot, used last,
    and another (``ASIDE``: where such a read went before, else the slot holding most of
    it), with the decision's first prompt coming. A read that went aside leaves the
    decision's own slot as it was."""

    def __init__(self, book: SlotBook, ubatch: int, fanned_out: int = 0):
        self._book, self._ubatch, self._fanned_out = book, ubatch, fanned_out
        # the first read's prompt (its segment, on the segment scheme): what the slots
        # will hold (``SlotBook.coming``); empty until a read is placed
        self.first: tuple[int, ...] = ()
        self._own: SlotContent | None = None  # what the decision's own slot holds
        self._aside: SlotContent | None = None  # where content-free reads go, once one went aside
        self._fresh = 0  # questions of the fan-out still to begin in a slot without it

    def place(
        self,
        prompt: tuple[int, ...],
        s_len: int,
        *,
        question: bool = False,
        content_free: bool = False,
    ) -> Placement:
        """The next read of the decision, of ``prompt`` (its segment the first ``s_len``
        tokens): the slot it goes to (``OWN`` or ``ASIDE``), what that holds and the
        requests that read it there. ``question``: the first read of a question after
        the first; ``content_free``: a content-free read (contextual calibration)."""
        book, ubatch = self._book, self._ubatch
        if not self.first:
            if ubatch:
                self.first, self._own = prompt, book.base(prompt)
            else:
                self.first, self._own = prompt[:s_len], book.base_segment(prompt, s_len)
                self._fresh = max(0, self._fanned_out - max(1, book.holding(self.first)))
        elif self._fresh and question:
            self._own, self._fresh = None, self._fresh - 1
        if content_free:
            aside = self._aside or (
                book.base(prompt) if ubatch else book.base_segment(prompt, s_len)
            )
            placed = self._slots(aside).placement(prompt, s_len, ubatch)
        else:
            placed = Placement(OWN, self._own, steps_at(self._own, prompt, s_len, ubatch))
        if placed.slot == OWN:
            self._own = SlotContent(prompt, s_len)
        else:
            self._aside = SlotContent(prompt, s_len)
        return placed

    def _slots(self, aside: SlotContent | None) -> SlotBook:
        """The free slots a content-free read chooses between, as a book of their own:
        the decision's own, used last, and (when the book has more than one) ``aside``;
        the decision's first prompt coming."""
        view = SlotBook([OWN, ASIDE] if self._book.size > 1 else [OWN])
        view.contents[OWN] = self._own
        if ASIDE in view.contents:
            view.contents[ASIDE] = aside
        view._last_use[OWN] = 1
        view._coming[OWN] = self.first
        return view


class _Lease:
    __slots__ = ("_book", "_segment", "_by_prefix", "_short", "_own", "_wait", "_facts", "_slot")

    def __init__(
        self,
        book: SlotBook,
        segment: tuple[int, ...],
        by_prefix: bool,
        short: bool,
        own: int,
        wait: bool,
        facts: Facts | None,
    ) -> None:
        self._book, self._segment, self._by_prefix = book, segment, by_prefix
        self._short, self._own, self._wait, self._facts = short, own, wait, facts

    async def __aenter__(self) -> int:
        book = self._book
        awaited = (
            book._worth_waiting(self._segment, None if self._by_prefix else self._own)
            if self._wait
            else None
        )
        if awaited is None and book._free and not book._waiting:
            self._slot = book._pick(self._segment, self._by_prefix)
            book._free.remove(self._slot)
            book._turns[self._slot] = 1
            return self._mark()
        behind = book._behind(self._segment, awaited) if self._short else None
        if behind is not None and not book._waiting and not book._waiting_for.get(behind):
            self._slot = behind  # its request waits in llama-server's queue
            book._turns[behind] += 1
            return self._mark()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self._short:
            book._queueable.add(waiter)
        if awaited is None:
            book._waiting.append(waiter)
        else:
            book._waiting_for.setdefault(awaited, collections.deque()).append(waiter)
        since = time.monotonic()
        try:
            self._slot = await waiter
            if self._facts is not None:
                self._facts.slot_wait_s += time.monotonic() - since
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                book._release(waiter.result())  # handed a slot, then cancelled: pass it on
            raise
        return self._mark()

    def _mark(self) -> int:
        book = self._book
        if self._segment:
            book._reading[self._slot] = self._segment
        if not self._short:
            book._short.discard(self._slot)
        elif book._turns[self._slot] == 1:
            book._short.add(self._slot)
        return self._slot

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        held = self._book.contents[self._slot]
        if exc_type is not None and not (held is not None and held.partial):
            self._book.contents[self._slot] = None  # a request cut short: the slot is unknown
        self._book._release(self._slot)
