"""The canonical evaluation of a prompt (proxy/kv.py): what is sent, in which chunks,
and what llama-server must report, for every state its slot can be in."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from proxy.kv import (
    ASIDE,
    MAX_SMALL_CHUNK,
    OWN,
    SlotBook,
    SlotContent,
    Step,
    after,
    common_prefix,
    lone_last,
    plan,
    plan_prefix,
)

S = tuple(range(100, 110))  # a shared segment of 10 tokens
Q = tuple(range(200, 206))  # a question of 6 tokens
P = S + Q  # 16 tokens


S_LEN = len(S)


def _h(tokens, s_len=S_LEN):
    return SlotContent(tuple(tokens), s_len)


@pytest.mark.parametrize(
    "content, steps",
    [
        # nothing known: S cold, the question but its last token as one chunk, the last alone
        (None, [Step(10, False, 0, 10), Step(15, True, 10, 5), Step(16, True, 15, 1)]),
        # another state (sharing a header) does not count: S cold again
        (
            _h((100, 101, 999)),
            [Step(10, False, 0, 10), Step(15, True, 10, 5), Step(16, True, 15, 1)],
        ),
        # the same tokens held with another segment length went through other kernels: cold
        (_h(P, s_len=12), [Step(10, False, 0, 10), Step(15, True, 10, 5), Step(16, True, 15, 1)]),
        (
            _h(S + Q, s_len=8),
            [Step(10, False, 0, 10), Step(15, True, 10, 5), Step(16, True, 15, 1)],
        ),
        # the same S, another question after it: from the end of S
        (_h(S + (300, 301)), [Step(15, True, 10, 5), Step(16, True, 15, 1)]),
        # another question sharing the first two question tokens: from there
        (_h(S + Q[:2] + (300,)), [Step(15, True, 12, 3), Step(16, True, 15, 1)]),
        # the whole prompt known (a replay): only the last token, again
        (_h(P), [Step(16, True, 15, 1)]),
        (_h(P + (7, 8)), [Step(16, True, 15, 1)]),
        # all but the last token known: the last one alone
        (_h(P[:15]), [Step(16, True, 15, 1)]),
        # all but two known: a one-token chunk would take another kernel, so the slot drops
        # one more token (a junk token in its place) and the chunk is two long
        (_h(P[:14]), [Step(14, True, 13, 1, junk=0), Step(15, True, 13, 2), Step(16, True, 15, 1)]),
    ],
)
def test_plan(content, steps):
    assert plan(content, len(S), P) == steps


def test_a_long_question_goes_in_chunks_of_2_to_63_tokens():
    question = tuple(range(1000, 1000 + 130))  # 129 rows before the last
    steps = plan(None, len(S), S + question)
    chunks = [s.evaluated for s in steps[1:-1]]
    assert chunks == [43, 43, 43] and max(chunks) <= MAX_SMALL_CHUNK
    assert [s.length for s in steps] == [10, 53, 96, 139, 140]


def test_a_two_token_question_reads_its_first_token_alone_every_time():
    prompt = S + (1, 2)
    assert plan(None, len(S), prompt) == [
        Step(10, False, 0, 10),
        Step(11, True, 10, 1),
        Step(12, True, 11, 1),
    ]
    assert plan(_h(S + (9,)), len(S), prompt) == [Step(11, True, 10, 1), Step(12, True, 11, 1)]


def test_the_junk_token_differs_from_the_one_it_replaces():
    prompt = S + (5, 0, 6, 7)  # the token the slot must drop is 0
    step = plan(_h(prompt[:12]), len(S), prompt)[0]
    assert step == Step(12, True, 11, 1, junk=1) and after(step, prompt) == S + (5, 1)


@pytest.mark.parametrize("bad", [0, 16, 20])
def test_the_shared_segment_must_be_a_proper_prefix(bad):
    with pytest.raises(ValueError):
        plan(None, bad, P)


async def test_a_lease_prefers_the_slot_that_holds_the_same_segment_then_an_unknown_one():
    book = SlotBook(3)
    book.contents = {0: SlotContent((1, 2, 3), 2), 1: None, 2: SlotContent((100, 101, 102, 7), 2)}
    async with book.lease((100, 101)) as slot:
        assert slot == 2
    async with book.lease((5,)) as slot:
        assert slot == 1  # unknown beats holding something else
    async with book.lease((1, 2)) as first:
        async with book.lease((1, 2)) as second:
            assert (first, second) == (0, 1)  # the preferred one is taken


async def test_a_lease_cut_short_forgets_what_the_slot_holds():
    book = SlotBook(1)
    book.contents = {0: SlotContent((1, 2), 1)}
    with pytest.raises(RuntimeError):
        async with book.lease((1,)):
            raise RuntimeError("upstream failed mid-read")
    assert book.contents == {0: None}


async def test_a_freed_slot_goes_to_the_first_waiter_not_to_a_newcomer():
    book = SlotBook(1)
    first = book.lease(())
    await first.__aenter__()
    waiter = asyncio.create_task(book.lease(()).__aenter__())
    await asyncio.sleep(0)
    await first.__aexit__(None, None, None)
    newcomer = asyncio.create_task(book.lease(()).__aenter__())  # before the waiter runs
    assert await waiter == 0
    await asyncio.sleep(0)
    assert not newcomer.done()  # it waits its turn
    newcomer.cancel()


async def test_a_lease_waits_for_a_free_slot_first_come_first_served():
    book = SlotBook(1)
    order = []

    async def decision(name: str) -> None:
        async with book.lease(()) as slot:
            order.append((name, slot))
            await asyncio.sleep(0)

    await asyncio.gather(decision("a"), decision("b"), decision("c"))
    assert order == [("a", 0), ("b", 0), ("c", 0)] and book._free == [0]


async def test_a_waiter_cancelled_after_its_wake_up_passes_the_slot_on():
    book = SlotBook(1)
    held = book.lease(())
    await held.__aenter__()
    second = asyncio.create_task(book.lease(()).__aenter__())
    third = asyncio.create_task(book.lease(()).__aenter__())
    await asyncio.sleep(0)
    await held.__aexit__(None, None, None)  # wakes the second ...
    second.cancel()  # ... which is cancelled before it runs
    assert await asyncio.wait_for(third, 1) == 0


async def test_a_book_of_some_slots_leases_only_those():
    book = SlotBook([1, 3])
    async with book.lease(()) as first, book.lease(()) as second:
        assert {first, second} == {1, 3}


# -- the prefix scheme (a llama-server with -ub 63) --------------------------------------

LONG = tuple(range(1000, 1300))  # 300 tokens: its last row alone is past 256 cells
SHORT = tuple(range(1000, 1200))  # 200 tokens: every row within 256 cells


@pytest.mark.parametrize(
    "content, prompt, steps",
    [
        # nothing known, short: one request from position 0, the last row in it
        (None, SHORT, [Step(200, False, 0, 200)]),
        # nothing known, long: all but the last from position 0, then the last alone
        (None, LONG, [Step(299, False, 0, 299), Step(300, True, 299, 1)]),
        # another conversation with the same opening: llama-server's prefix is as good as cold
        (SlotContent(SHORT[:30] + (7,), 0), SHORT, [Step(200, True, 30, 170)]),
        (
            SlotContent(LONG[:100] + (7,), 0),
            LONG,
            [Step(299, True, 100, 199), Step(300, True, 299, 1)],
        ),
        # a replay, and a prompt held with more after it: the last row alone again
        (SlotContent(SHORT, 0), SHORT, [Step(200, True, 199, 1)]),
        (SlotContent(LONG, 0, lone_last=True), LONG, [Step(300, True, 299, 1)]),
        (SlotContent(LONG + (5, 6), 0), LONG, [Step(300, True, 299, 1)]),
        # a longer prompt after a long read: its lone last row is dropped first
        (
            SlotContent(LONG[:280], 0, lone_last=True),
            LONG,
            [Step(280, True, 279, 1, junk=0), Step(299, True, 279, 20), Step(300, True, 299, 1)],
        ),
        # ... a short read's last row was in the per-row kernel: kept
        (SlotContent(LONG[:200], 0), LONG, [Step(299, True, 200, 99), Step(300, True, 299, 1)]),
        # a last piece of one token past 256 cells (64 = 63 + 1) is avoided: two rows first
        (
            SlotContent(LONG[:235], 0),
            LONG,
            [Step(237, True, 235, 2), Step(299, True, 237, 62), Step(300, True, 299, 1)],
        ),
        # ... and when one row is all that is missing, the slot drops one more
        (
            SlotContent(LONG[:298], 0),
            LONG,
            [Step(298, True, 297, 1, junk=0), Step(299, True, 297, 2), Step(300, True, 299, 1)],
        ),
    ],
)
def test_plan_prefix(content, prompt, steps):
    assert plan_prefix(content, prompt, 63) == steps


def test_plan_prefix_counts_pieces_per_logical_batch():
    prompt = tuple(range(5000, 5000 + 2050))  # 2049 rows before the last: 2048 + a piece of 1
    steps = plan_prefix(None, prompt, 63)
    assert steps == [Step(2, False, 0, 2), Step(2049, True, 2, 2047), Step(2050, True, 2049, 1)]


@pytest.mark.parametrize(
    "step, lone",
    [
        (Step(300, True, 299, 1), True),  # the last row of a long read
        (Step(200, True, 199, 1), False),  # within 256 cells: the per-row kernel
        (Step(300, True, 236, 64), True),  # a last piece of one
        (Step(300, True, 237, 63), False),
    ],
)
def test_lone_last(step, lone):
    assert lone_last(step, 63) is lone


@pytest.mark.parametrize("ubatch", [1, 64, 512])
def test_the_prefix_scheme_needs_a_small_physical_batch(ubatch):
    with pytest.raises(ValueError):
        plan_prefix(None, SHORT, ubatch)


async def test_a_decision_waits_for_the_slot_that_is_reading_its_long_prefix():
    book = SlotBook(2)
    state = tuple(range(5000, 5300))  # 300 tokens another decision is reading in a slot
    first = book.lease(state + (1, 2), by_prefix=True)
    slot = await first.__aenter__()
    waiting = asyncio.ensure_future(book.lease(state + (3, 4), by_prefix=True).__aenter__())
    await asyncio.sleep(0)
    assert not waiting.done()  # slot 1 is free, but holds none of the 300 tokens
    # a prompt that shares less than WAIT_FOR_PREFIX tokens takes the free slot at once
    async with book.lease(state[:100] + (9,), by_prefix=True) as other:
        assert other != slot
    book.contents[slot] = SlotContent(state + (1, 2), 0)
    await first.__aexit__(None, None, None)
    assert await waiting == slot


async def test_a_free_slot_that_holds_the_prefix_is_taken_at_once_and_then_waited_for():
    book = SlotBook(2)
    state = tuple(range(5000, 5300))
    book.contents[1] = SlotContent(state, 0)
    first = book.lease(state + (1,), by_prefix=True)
    assert await first.__aenter__() == 1  # the free slot that holds the state
    # the next question about the state waits for that slot rather than evaluate the
    # state again in slot 0
    second = asyncio.ensure_future(book.lease(state + (2,), by_prefix=True).__aenter__())
    await asyncio.sleep(0)
    assert not second.done()
    await first.__aexit__(None, None, None)
    assert await second == 1


@pytest.mark.parametrize("coming", [True, False])
async def test_a_read_does_not_take_the_slot_holding_what_a_coming_decision_needs(coming):
    """A question's content-free read (another conversation with the same opening) goes to
    another slot than the one holding the state the decision's next question reads on;
    without that decision coming, the longest prefix wins, as llama-server chooses."""
    book = SlotBook(2)
    opening, state = tuple(range(20)), tuple(range(5000, 5300))
    book.contents[0] = SlotContent(opening + state + (1,), 0)
    book.contents[1] = SlotContent(
        tuple(range(900, 1000)), 0
    )  # another conversation, used longer ago
    free = opening + (7, 8, 9)
    with book.coming(opening + state + (1,)) if coming else contextlib.nullcontext():
        async with book.lease(free, by_prefix=True) as slot:
            assert slot == (1 if coming else 0)
        # what the decision reads itself is not kept from its own slot
        async with book.lease(opening + state + (2,), by_prefix=True) as slot:
            assert slot == 0
        # a content-free read that shares most of the state (earlier turns, the last one
        # replaced) drops less of it than it would evaluate elsewhere: the same slot
        async with book.lease(opening + state[:290] + (7,), by_prefix=True) as slot:
            assert slot == 0


async def test_on_the_segment_scheme_a_read_keeps_off_a_coming_decisions_segment():
    """A read whose segment no slot holds takes an empty slot, else one holding no
    coming decision's segment, though that one was used more lately; with every slot
    holding one, the one used longest ago."""
    book = SlotBook(3)
    state = tuple(range(5000, 5300))
    book.contents = {0: SlotContent(state + (1,), 300), 1: SlotContent((900, 901, 2), 2), 2: None}
    book._last_use.update({0: 1, 1: 2, 2: 3})
    with book.coming(state):
        async with book.lease((7, 8, 9)) as slot:
            assert slot == 2  # empty
        async with book.lease((7, 8, 9)) as a, book.lease((6, 8, 9)) as b:
            assert (a, b) == (2, 1)  # the empty one again, then what no decision needs
        book.contents[1] = SlotContent(state + (2,), 300)
        book.contents[2] = SlotContent(state + (3,), 300)
        book._last_use.update({0: 1, 1: 2, 2: 3})
        async with book.lease((5, 8, 9)) as slot:
            assert slot == 0  # every slot holds one: the one used longest ago
    book.contents = {
        0: SlotContent(state + (1,), 300),
        1: SlotContent((4, 5), 2),
        2: SlotContent((6, 7), 2),
    }
    book._last_use.update({0: 1, 1: 2, 2: 3})
    async with book.lease((5, 8, 9)) as slot:
        assert slot == 0  # nothing coming: the one used longest ago


async def test_a_read_may_drop_what_a_coming_decision_needs_when_another_slot_holds_it():
    """Only what no other slot holds is lost: of two slots holding the state, the one
    used longest ago goes to another conversation's read, not a third slot's content;
    and with one slot, the read takes it."""
    book = SlotBook(3)
    opening, state = tuple(range(20)), tuple(range(5000, 5300))
    book.contents[0] = SlotContent(opening + state + (1,), 0)
    book.contents[1] = SlotContent(opening + state + (2,), 0)
    book.contents[2] = SlotContent(opening + tuple(range(900, 1000)), 0)
    book._last_use.update({0: 3, 1: 1, 2: 2})
    with book.coming(opening + state + (3,)):
        async with book.lease(opening + (7, 8, 9), by_prefix=True) as slot:
            assert slot == 1
    # a tie between what a read saves in one slot and what it drops there: the slot
    # used longest ago, as without anything coming
    tie = SlotBook(2)
    tie.contents[0] = SlotContent(opening + state[:20], 0)
    tie._last_use.update({0: 2, 1: 1})
    with tie.coming(opening + state):
        async with tie.lease(opening + (7,), by_prefix=True) as slot:
            assert slot == 1
    alone = SlotBook(1)
    alone.contents[0] = SlotContent(opening + state, 0)
    with alone.coming(opening + state + (3,)):
        async with alone.lease(opening + (7,), by_prefix=True) as slot:
            assert slot == 0


async def test_no_more_decisions_wait_for_a_slot_than_the_tokens_it_saves_are_worth():
    book = SlotBook(3)
    fixed = tuple(range(7000, 7200))  # a classifier's 200 tokens before 100-token tickets
    ticket = [tuple(range(i * 1000, i * 1000 + 100)) for i in (1, 2, 3)]
    first = book.lease(fixed + ticket[0], by_prefix=True)
    slot = await first.__aenter__()
    # 100 + 16 tokens for the read it waits behind: less than the 200 it saves
    waiter = asyncio.ensure_future(book.lease(fixed + ticket[1], by_prefix=True).__aenter__())
    await asyncio.sleep(0)
    assert not waiter.done()
    # two reads of 116 ahead of it would cost more than evaluating the 200 again
    async with book.lease(fixed + ticket[2], by_prefix=True) as third:
        assert third != slot
    await first.__aexit__(None, None, None)
    assert await waiter == slot


async def test_questions_sent_at_once_about_one_long_state_all_wait_for_the_slot_reading_it():
    book = SlotBook(4)
    state = tuple(range(10_000, 11_600))  # 1,600 tokens
    questions = [state + tuple(range(i * 100, i * 100 + 40)) for i in range(16)]
    first = book.lease(questions[0], by_prefix=True)
    slot = await first.__aenter__()
    rest = [
        asyncio.ensure_future(book.lease(q, by_prefix=True).__aenter__()) for q in questions[1:]
    ]
    await asyncio.sleep(0)
    assert not any(r.done() for r in rest)  # 15 x (40 + 16) < 1,600: none evaluates it again
    assert sorted(book._free) == sorted({0, 1, 2, 3} - {slot})
    await first.__aexit__(None, None, None)
    assert await rest[0] == slot
    for r in rest[1:]:
        r.cancel()


async def test_with_every_slot_leased_a_prefix_they_all_will_hold_is_no_reason_to_wait_for_one():
    book = SlotBook(2)
    fixed = tuple(range(7000, 7300))
    book.contents = {0: SlotContent(fixed + (0,), 0), 1: SlotContent(fixed + (0,), 0)}  # both warm
    first, second = (book.lease(fixed + (i,), by_prefix=True) for i in (1, 2))
    a = await first.__aenter__()
    b = await second.__aenter__()
    third = asyncio.ensure_future(book.lease(fixed + (3,), by_prefix=True).__aenter__())
    await asyncio.sleep(0)
    await second.__aexit__(None, None, None)  # the first slot freed goes to it
    assert await asyncio.wait_for(third, 5) == b and a != b
    await first.__aexit__(None, None, None)


# -- estimates: what a read will build on (SlotBook.base) --------------------------------

STATE = tuple(range(1000, 2500))  # a 1,500-token state
QUESTION = (7, 8, 9, 10)


def _asked(n: int) -> tuple[int, ...]:
    return (*STATE, *QUESTION, n)


def test_base_is_the_slot_holding_most_when_nothing_is_coming():
    book = SlotBook(2)
    assert book.base(_asked(1)) is None
    book.contents[1] = SlotContent(STATE[:300], 0)
    assert book.base(_asked(1)) == SlotContent(STATE[:300], 0)


def test_base_counts_a_state_coming_once_for_those_that_will_wait_for_it():
    book = SlotBook(4)
    with book.coming(_asked(0)):
        base = book.base(_asked(1))
        # the shared part (state and question) as if held: only this request's own tokens
        assert base == SlotContent(_asked(1)[:1504], 0)
        steps = plan_prefix(base, _asked(1), 63)
        assert [s.evaluated for s in steps] == [1]  # its last token, read alone
    assert book.base(_asked(1)) is None  # finished (or refused): nothing is coming


def test_base_stops_counting_on_the_shared_part_when_too_many_would_wait():
    # own part 1 + READ_TOKENS 16 = 17 tokens each: 1,504 tokens shared are worth waiting
    # for while the sharers number at most 1504 // 17 = 88, as the lease rule says
    book = SlotBook(4)
    with contextlib.ExitStack() as stack:
        for n in range(88):
            stack.enter_context(book.coming(_asked(n)))
        assert book.base(_asked(100)) == SlotContent(_asked(100)[:1504], 0)
        stack.enter_context(book.coming(_asked(88)))
        assert book.base(_asked(100)) is None


def test_base_prefers_what_a_slot_holds_when_it_is_no_less_than_what_is_coming():
    book = SlotBook(2)
    book.contents[0] = SlotContent(STATE[:1400], 0)
    with book.coming(_asked(0)):  # 104 tokens more than held: under WAIT_FOR_PREFIX (128)
        assert book.base(_asked(1)) == SlotContent(STATE[:1400], 0)


# -- the segment scheme: questions wait for the slot reading their segment ---------------

SEGMENT = tuple(range(20_000, 21_000))  # a 1,000-token state before the questions


async def test_on_the_segment_scheme_a_question_waits_for_the_slot_reading_its_segment():
    book = SlotBook(2)
    first = book.lease(SEGMENT, own=40)
    slot = await first.__aenter__()
    waiting = asyncio.ensure_future(book.lease(SEGMENT, own=40).__aenter__())
    await asyncio.sleep(0)
    assert not waiting.done()  # the other slot is free, but would evaluate the state again
    # another segment, and one that only begins like it (other kernels), take it at once
    for other_segment in (tuple(range(30_000, 31_000)), SEGMENT[:900]):
        other = book.lease(other_segment, own=40)
        assert await asyncio.wait_for(other.__aenter__(), 1) != slot
        await other.__aexit__(None, None, None)
    book.contents[slot] = SlotContent((*SEGMENT, 1, 2), len(SEGMENT))
    await first.__aexit__(None, None, None)
    assert await waiting == slot


async def test_on_the_segment_scheme_a_free_slot_holding_the_segment_is_taken_at_once():
    book = SlotBook(2)
    book.contents[1] = SlotContent((*SEGMENT, 5), len(SEGMENT))
    book.contents[0] = SlotContent((*SEGMENT, 5), 500)  # the same tokens, another segment's kernels
    first = book.lease(SEGMENT, own=40)
    assert await first.__aenter__() == 1
    second = asyncio.ensure_future(book.lease(SEGMENT, own=40).__aenter__())
    await asyncio.sleep(0)
    assert not second.done()  # slot 0's rows were evaluated with a segment of 500
    await first.__aexit__(None, None, None)
    assert await second == 1


async def test_on_the_segment_scheme_a_free_slot_holding_the_segment_beats_waiting():
    book = SlotBook(3)
    book.contents[2] = SlotContent((*SEGMENT, 5), len(SEGMENT))
    book.contents[1] = SlotContent((*SEGMENT, 5), len(SEGMENT))
    first = book.lease(SEGMENT, own=40)
    reading = await first.__aenter__()
    second = book.lease(SEGMENT, own=40)
    free = await asyncio.wait_for(second.__aenter__(), 1)  # the other slot holding it
    assert {reading, free} == {1, 2}
    await second.__aexit__(None, None, None)
    await first.__aexit__(None, None, None)


async def test_on_the_segment_scheme_a_read_asked_not_to_wait_takes_a_free_slot():
    book = SlotBook(2)
    first = book.lease(SEGMENT, own=40)
    slot = await first.__aenter__()
    other = book.lease(SEGMENT, own=40, wait=False)  # a request's fan-out (service._ask)
    assert await asyncio.wait_for(other.__aenter__(), 1) != slot
    await other.__aexit__(None, None, None)
    await first.__aexit__(None, None, None)


async def test_on_the_segment_scheme_with_every_slot_reading_it_the_first_freed_serves():
    book = SlotBook(2)
    book.contents = {
        0: SlotContent((*SEGMENT, 5), len(SEGMENT)),
        1: SlotContent((*SEGMENT, 6), len(SEGMENT)),
    }
    a, b = book.lease(SEGMENT, own=40), book.lease(SEGMENT, own=40)
    first = await asyncio.wait_for(a.__aenter__(), 1)
    second = await asyncio.wait_for(b.__aenter__(), 1)  # the other slot that holds it
    third = asyncio.ensure_future(book.lease(SEGMENT, own=40).__aenter__())
    await asyncio.sleep(0)
    await b.__aexit__(None, None, None)  # both will hold it: the first freed goes to it
    assert await asyncio.wait_for(third, 1) == second != first
    await a.__aexit__(None, None, None)


async def test_on_the_segment_scheme_waiting_stops_where_it_costs_more_than_the_segment():
    book = SlotBook(4)
    # each waiter evaluates 40 + READ_TOKENS 16 = 56 tokens there: 17 x 56 = 952 <= 1,000,
    # so 17 wait; an 18th would make 18 x 56 = 1,008 > 1,000: it takes a free slot
    first = book.lease(SEGMENT, own=40)
    slot = await first.__aenter__()
    rest = [asyncio.ensure_future(book.lease(SEGMENT, own=40).__aenter__()) for _ in range(17)]
    await asyncio.sleep(0)
    assert not any(r.done() for r in rest)
    eighteenth = book.lease(SEGMENT, own=40)
    assert await asyncio.wait_for(eighteenth.__aenter__(), 1) != slot
    await eighteenth.__aexit__(None, None, None)
    for r in rest:
        r.cancel()
    await first.__aexit__(None, None, None)


async def test_on_the_segment_scheme_a_short_segment_is_not_waited_for():
    book = SlotBook(2)
    short_segment = SEGMENT[:100]  # under WAIT_FOR_PREFIX (128)
    first = book.lease(short_segment, own=10)
    slot = await first.__aenter__()
    other = book.lease(short_segment, own=10)
    assert await asyncio.wait_for(other.__aenter__(), 1) != slot
    await other.__aexit__(None, None, None)
    await first.__aexit__(None, None, None)


def _asked_segment(n: int) -> tuple[int, ...]:
    return (*SEGMENT, 7, 8, 9, n)


def test_base_segment_is_the_slot_holding_the_segment_and_most_after_it():
    book = SlotBook(3)
    assert book.base_segment(_asked_segment(1), len(SEGMENT)) is None
    book.contents[0] = SlotContent(_asked_segment(0), 500)  # another segment's kernels: not it
    book.contents[1] = SlotContent((*SEGMENT, 1), len(SEGMENT))
    book.contents[2] = SlotContent(_asked_segment(0), len(SEGMENT))
    assert book.base_segment(_asked_segment(1), len(SEGMENT)) == book.contents[2]


def test_base_segment_counts_a_segment_coming_once_for_those_that_will_wait_for_it():
    book = SlotBook(4)
    with book.coming(SEGMENT):
        base = book.base_segment(_asked_segment(1), len(SEGMENT))
        assert base == SlotContent(SEGMENT, len(SEGMENT))
        steps = plan(base, len(SEGMENT), _asked_segment(1))
        assert sum(s.evaluated for s in steps) == 4  # its own 4 tokens, not the state
    assert book.base_segment(_asked_segment(1), len(SEGMENT)) is None


def test_base_segment_stops_counting_on_the_segment_when_too_many_would_wait():
    # own part 4 + READ_TOKENS 16 = 20 tokens each: 1,000 shared are worth waiting for
    # while the sharers number at most 1000 // 20 = 50
    book = SlotBook(4)
    with contextlib.ExitStack() as stack:
        for _ in range(50):
            stack.enter_context(book.coming(SEGMENT))
        assert book.base_segment(_asked_segment(1), len(SEGMENT)) == SlotContent(
            SEGMENT, len(SEGMENT)
        )
        stack.enter_context(book.coming(SEGMENT))
        assert book.base_segment(_asked_segment(1), len(SEGMENT)) is None


async def test_a_short_lease_queues_behind_a_short_one_and_no_deeper():
    book = SlotBook(1, depth=2)
    first = book.lease((1, 2), by_prefix=True, short=True)
    second = book.lease((1, 3), by_prefix=True, short=True)
    assert await first.__aenter__() == 0
    assert await second.__aenter__() == 0  # at once: its request waits in llama-server
    third = asyncio.ensure_future(book.lease((1, 4), by_prefix=True, short=True).__aenter__())
    await asyncio.sleep(0)
    assert not third.done()  # two per slot at most
    await first.__aexit__(None, None, None)  # the slot has room behind the second again
    assert await asyncio.wait_for(third, 1) == 0
    await second.__aexit__(None, None, None)
    assert book._free == [] and book._turns[0] == 1  # the third still holds it


async def test_nothing_queues_behind_a_lease_that_is_not_short():
    book = SlotBook(1, depth=2)
    long = book.lease((1, 2), by_prefix=True)  # several requests: the slot is its own
    await long.__aenter__()
    short = asyncio.ensure_future(book.lease((1, 3), by_prefix=True, short=True).__aenter__())
    await asyncio.sleep(0)
    assert not short.done()
    await long.__aexit__(None, None, None)
    assert await asyncio.wait_for(short, 1) == 0


async def test_a_lease_that_is_not_short_waits_for_every_read_queued_in_the_slot():
    book = SlotBook(1, depth=2)
    a, b = (book.lease((i,), by_prefix=True, short=True) for i in (1, 2))
    await a.__aenter__()
    await b.__aenter__()
    long = asyncio.ensure_future(book.lease((3,), by_prefix=True).__aenter__())
    late = asyncio.ensure_future(book.lease((4,), by_prefix=True, short=True).__aenter__())
    await asyncio.sleep(0)
    await a.__aexit__(None, None, None)
    await asyncio.sleep(0)
    assert not long.done() and not late.done()  # the short one does not pass the long one
    await b.__aexit__(None, None, None)
    assert await asyncio.wait_for(long, 1) == 0
    await asyncio.sleep(0)
    assert not late.done()


async def test_with_depth_one_a_short_lease_waits_as_any_other():
    book = SlotBook(1)
    first = book.lease((1,), by_prefix=True, short=True)
    await first.__aenter__()
    second = asyncio.ensure_future(book.lease((2,), by_prefix=True, short=True).__aenter__())
    await asyncio.sleep(0)
    assert not second.done()
    await first.__aexit__(None, None, None)
    assert await asyncio.wait_for(second, 1) == 0


async def test_a_short_lease_queues_behind_the_slot_with_fewest_then_most_of_its_prompt():
    book = SlotBook(2, depth=2)
    await book.lease((1, 2, 3), by_prefix=True, short=True).__aenter__()
    await book.lease((7, 8, 9), by_prefix=True, short=True).__aenter__()
    assert await book.lease((7, 8, 5), by_prefix=True, short=True).__aenter__() == 1
    assert await book.lease((7, 8, 6), by_prefix=True, short=True).__aenter__() == 0


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ((), (), 0),
        ((), (1, 2), 0),
        ((1, 2, 3), (1, 2, 3), 3),
        ((1, 2, 3), (1, 2, 3, 4, 5), 3),
        ((1, 2, 3, 4, 5), (1, 2), 2),
        ((7, 2, 3), (1, 2, 3), 0),
        ((1, 2, 3), (1, 2, 9), 2),
        ((1, 2, 3), [1, 2, 3, 4], 3),  # a tuple against a list
        ([1, 5], (1, 2, 3), 1),
    ],
)
def test_common_prefix(a, b, expected):
    assert common_prefix(a, b) == expected
    assert common_prefix(b, a) == expected


def test_common_prefix_finds_every_first_difference():
    """Against the token-by-token definition, for a difference at each place of a long
    prompt (the halving must land on it exactly)."""
    base = tuple(range(1000, 1300))
    for at in range(len(base)):
        other = (*base[:at], -1, *base[at + 1 :])
        assert common_prefix(base, other) == at
        assert common_prefix(base[: at + 5], list(other)) == at


async def test_streams_about_states_the_slots_hold_pass_a_decision_in_line_at_most_size_times():
    """Every slot reads a long state of its own, and each read's follow-up arrives while
    it runs, waiting for that slot; a decision about something else waits in line for
    any slot. It is passed over at most ``size`` times, then served."""
    book = SlotBook(2)
    states = [tuple(range(s, s + 300)) for s in (10_000, 20_000)]
    asked = 0

    async def ask(slot_state: tuple[int, ...]):
        nonlocal asked
        asked += 1
        lease = book.lease(slot_state + (asked,), by_prefix=True)
        return lease, asyncio.ensure_future(lease.__aenter__())

    running = []
    for state in states:
        lease, entered = await ask(state)
        running.append((lease, await entered))
    other = asyncio.ensure_future(book.lease((1, 2, 3), by_prefix=True).__aenter__())
    await asyncio.sleep(0)
    passed = 0
    for turn in range(8):
        follow = [await ask(state) for state in states]  # one waits for each slot
        await asyncio.sleep(0)
        assert not any(f.done() for _, f in follow)
        lease, slot = running[turn % 2]
        book.contents[slot] = SlotContent(states[turn % 2] + (0,), 0)
        await lease.__aexit__(None, None, None)
        await asyncio.sleep(0)
        if other.done():
            break
        passed += 1
        mine = follow[turn % 2]
        assert mine[1].done() and await mine[1] == slot  # the follow-up took its slot
        running[turn % 2] = (mine[0], slot)
        for _, f in follow:
            if not f.done():
                f.cancel()
    assert other.done() and passed == book.size
    for _, f in follow:
        f.cancel()


async def test_short_leases_queued_behind_for_a_held_prefix_pass_the_line_at_most_size_times():
    """The same rule where short reads queue behind one another in a slot (``depth`` 2):
    a stream of short questions about the prefix one slot is reading passes a decision in
    line for any slot at most ``size`` times, then lets it queue behind."""
    book = SlotBook(2, depth=2)
    fixed = tuple(range(7000, 7200))  # a classifier's fixed part, read in slot 0
    long = await book.lease((1, 2, 3), by_prefix=True).__aenter__()  # another, long read
    asked = iter(range(1, 100))

    def ask():
        lease = book.lease(fixed + (next(asked),), by_prefix=True, short=True)
        return lease, asyncio.ensure_future(lease.__aenter__())

    leases = [ask(), ask()]  # one reads in slot 0, one queues behind it
    slot = 1 - long
    assert [await entered for _, entered in leases] == [slot, slot]
    leases.append(ask())  # waits for slot 0's prefix
    other = asyncio.ensure_future(book.lease((4, 5), by_prefix=True, short=True).__aenter__())
    await asyncio.sleep(0)
    assert not other.done() and not leases[-1][1].done()
    passed = 0
    while not other.done():
        lease, _ = leases.pop(0)
        await lease.__aexit__(None, None, None)  # room behind in that slot again
        await asyncio.sleep(0)
        if other.done():
            break
        passed += 1
        assert leases[1][1].done()  # the next question about the prefix queued behind
        leases.append(ask())
        await asyncio.sleep(0)
        assert passed <= book.size
    assert await other == slot and passed == book.size
    leases[-1][1].cancel()


# -- where a read lands and what it evaluates there (SlotBook.placement, Trail) ----------

OPENING = tuple(range(20))  # the template's opening, which every prompt shares
LONG = OPENING + tuple(range(5000, 5280))  # a 300-token state: past 256 cells
P1, P2, P3 = LONG + (1, 2, 3), LONG + (3, 2, 1), LONG + (4, 5, 6)  # 303 tokens each
FREE_NEAR = LONG[:290] + (7,)  # a content-free turn sharing most of the state
FREE_FAR, FREE_FAR2 = OPENING + (7, 8, 9), OPENING + (7, 8, 10)  # sharing the opening


@pytest.mark.parametrize(
    ("contents", "last_use", "coming", "prompt", "s_len", "ubatch", "slot", "steps"),
    [
        # an empty book: the first slot, all of it evaluated (two requests past 256 cells)
        (
            [None, None],
            {},
            None,
            P1,
            300,
            63,
            0,
            [Step(302, False, 0, 302), Step(303, True, 302, 1)],
        ),
        # a slot holding a prefix of the prompt: from there
        (
            [SlotContent(OPENING, 0), SlotContent(LONG[:200], 0)],
            {},
            None,
            P1,
            300,
            63,
            1,
            [Step(302, True, 200, 102), Step(303, True, 302, 1)],
        ),
        # two slots holding the same prefix: the one used longest ago
        (
            [SlotContent(LONG[:200], 0), SlotContent(LONG[:200], 0)],
            {0: 2, 1: 1},
            None,
            P1,
            300,
            63,
            1,
            [Step(302, True, 200, 102), Step(303, True, 302, 1)],
        ),
        # a read keeps off the slot holding the state a coming decision reads on
        (
            [SlotContent(P1, 0), SlotContent(OPENING + (900, 901), 0)],
            {},
            P2,
            FREE_FAR,
            20,
            63,
            1,
            [Step(23, True, 20, 3)],
        ),
        # ... unless it keeps more of it there than it drops: the content-free read stays
        ([SlotContent(P1, 0), None], {}, P2, FREE_NEAR, 20, 63, 0, [Step(291, True, 290, 1)]),
        # the segment scheme: an empty book, the segment cold
        (
            [None, None],
            {},
            None,
            P,
            S_LEN,
            0,
            0,
            [Step(10, False, 0, 10), Step(15, True, 10, 5), Step(16, True, 15, 1)],
        ),
        # ... and the slot holding the segment, from its end
        (
            [None, _h(S + (300, 301))],
            {},
            None,
            P,
            S_LEN,
            0,
            1,
            [Step(15, True, 10, 5), Step(16, True, 15, 1)],
        ),
    ],
    ids=["empty", "prefix", "shared", "keeps-off", "stays", "segment-empty", "segment-held"],
)
async def test_placement_is_the_slot_a_lease_takes_and_the_steps_read_there(
    contents, last_use, coming, prompt, s_len, ubatch, slot, steps
):
    book = SlotBook(len(contents))
    book.contents = dict(enumerate(contents))
    book._last_use.update(last_use)
    with book.coming(coming) if coming else contextlib.nullcontext():
        placed = book.placement(prompt, s_len, ubatch)
        assert placed == (slot, contents[slot], steps)
        assert placed.evaluated == sum(step.evaluated for step in steps)
        segment = prompt if ubatch else prompt[:s_len]
        async with book.lease(segment, by_prefix=bool(ubatch)) as leased:
            assert leased == slot


# each read: (prompt, s_len, question, content_free) -> (slot, what it builds on, evaluated)
_NEAR_TRAIL = [
    ((P1, 300, False, False), (OWN, None, 303)),  # an empty book: all of it
    ((P2, 300, False, False), (OWN, SlotContent(P1, 300), 3)),  # a rotation: its own part
    ((FREE_NEAR, 290, False, True), (OWN, SlotContent(P2, 300), 1)),  # keeps more than it drops
    ((P3, 300, True, False), (OWN, SlotContent(FREE_NEAR, 290), 13)),  # the next question after it
]
_FAR_TRAIL = [
    ((P1, 300, False, False), (OWN, None, 303)),
    ((FREE_FAR, 20, False, True), (ASIDE, None, 23)),  # would drop the state: aside
    ((P3, 300, True, False), (OWN, SlotContent(P1, 300), 3)),  # the state still in its own slot
    ((FREE_FAR2, 20, False, True), (ASIDE, SlotContent(FREE_FAR, 20), 1)),  # where the last went
]
_TIE_TRAIL = [  # as much kept as dropped: the other slot, the decision's was used last
    ((P1, 300, False, False), (OWN, None, 303)),
    ((P2, 300, False, False), (OWN, SlotContent(P1, 300), 3)),
    ((LONG[:150] + (7,), 150, False, True), (ASIDE, None, 151)),
]
_ALONE_TRAIL = [  # one slot: the content-free read takes it, state and all
    ((P1, 300, False, False), (OWN, None, 303)),
    ((FREE_FAR, 20, False, True), (OWN, SlotContent(P1, 300), 3)),
    ((P3, 300, True, False), (OWN, SlotContent(FREE_FAR, 20), 283)),
]
QA, QB, QC = S + Q, S + tuple(range(300, 306)), S + tuple(range(400, 406))
FREE_SEGMENT = (100, 101, 500, 501, 502, 503, 504, 505)  # the content-free turn's own segment
_SEGMENT_TRAIL = [  # a fan-out of two at once over two empty slots
    ((QA, S_LEN, False, False), (OWN, None, 16)),
    ((FREE_SEGMENT, 4, False, True), (ASIDE, None, 8)),  # keeps off the coming segment
    ((QB, S_LEN, True, False), (OWN, None, 16)),  # in the other slot: the segment again
    ((QC, S_LEN, True, False), (OWN, SlotContent(QB, S_LEN), 6)),
]


@pytest.mark.parametrize(
    ("slots", "ubatch", "fanned_out", "reads"),
    [
        (2, 63, 0, _NEAR_TRAIL),
        (2, 63, 0, _FAR_TRAIL),
        (2, 63, 0, _TIE_TRAIL),
        (1, 63, 0, _ALONE_TRAIL),
        (2, 0, 2, _SEGMENT_TRAIL),
    ],
    ids=["near", "far", "tie", "alone", "segment"],
)
def test_a_trail_places_a_decisions_reads_as_the_book_will(slots, ubatch, fanned_out, reads):
    """Admission's estimate: each read of a decision, where it lands and what it evaluates
    there, the first in an empty book."""
    trail = SlotBook(slots).trail(ubatch, fanned_out)
    for (prompt, s_len, question, content_free), (slot, held, evaluated) in reads:
        placed = trail.place(prompt, s_len, question=question, content_free=content_free)
        assert (placed.slot, placed.content, placed.evaluated) == (slot, held, evaluated)
    first = reads[0][0]
    assert trail.first == (first[0] if ubatch else first[0][: first[1]])


def test_a_trail_builds_on_the_state_a_coming_decision_reads():
    """The first read waits for the decision reading its state (``SlotBook.base``): only
    its own last token is evaluated."""
    book = SlotBook(4)
    with book.coming(_asked(0)):
        placed = book.trail(63).place(_asked(1), len(STATE))
    assert placed == (OWN, SlotContent(_asked(1)[:1504], 0), [Step(1505, True, 1504, 1)])
