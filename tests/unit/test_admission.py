"""Backpressure and deadlines, with real asyncio timing (short, bounded)."""

import asyncio
import contextlib
from types import SimpleNamespace

import pytest

import proxy.admission as admission_module
from proxy.admission import Admission, Work, server_timing
from proxy.cost import CHUNK, ONE, CostModel
from proxy.deadlines import Deadline
from proxy.errors import InvalidRequest, Overloaded, UpstreamTimeout
from proxy.facts import Facts
from proxy.queueing import estimated_finish_s, finish_s, smoothed, turns_s
from proxy.routes.common import relayed_cost


async def _hold(
    admission: Admission, release: asyncio.Event, started: list, mark: object = 1
) -> None:
    async with admission.admit():
        started.append(mark)
        await release.wait()


async def test_past_active_and_queued_bounds_requests_are_refused_with_retry_after():
    admission = Admission(max_active=2, max_queued=1, deadline_s=5, retry_after_s=3)
    release, started = asyncio.Event(), []
    tasks = [asyncio.create_task(_hold(admission, release, started)) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert len(started) == 2 and admission.queued == 1  # two run, one waits
    with pytest.raises(Overloaded) as caught:
        async with admission.admit():
            pass
    assert caught.value.status == 429 and caught.value.headers() == {"Retry-After": "3"}
    release.set()
    await asyncio.gather(*tasks)
    assert len(started) == 3 and admission.queued == 0
    async with admission.admit():  # free again
        pass


async def test_deadline_cancels_the_work_and_answers_504():
    admission = Admission(max_active=1, max_queued=0, deadline_s=0.1, retry_after_s=1)
    cancelled = asyncio.Event()

    async def slow():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(UpstreamTimeout) as caught:
        async with admission.admit():
            await slow()
    assert caught.value.status == 504 and "0.1 s deadline" in caught.value.message
    assert cancelled.is_set()


async def test_time_spent_queued_counts_against_the_deadline():
    admission = Admission(max_active=1, max_queued=5, deadline_s=0.3, retry_after_s=1)
    release, started = asyncio.Event(), []
    holder = asyncio.create_task(_hold(admission, release, started))  # cut at t=0.3
    await asyncio.sleep(0.05)
    # queued from 0.05 to 0.3, then 0.2 s of work: over a deadline counted from
    # arrival (0.35), within one counted from admission (0.6)
    with pytest.raises(UpstreamTimeout):
        async with admission.admit():
            await asyncio.sleep(0.2)
    assert admission.queued == 0
    with pytest.raises(UpstreamTimeout):
        await holder


@pytest.mark.parametrize(("active", "queued"), [(0, 1), (1, -1)])
def test_bounds_are_checked(active, queued):
    with pytest.raises(ValueError):
        Admission(max_active=active, max_queued=queued, deadline_s=1, retry_after_s=1)


async def test_cancelled_waiters_leave_no_slot_behind_and_order_is_kept():
    admission = Admission(max_active=1, max_queued=5, deadline_s=5, retry_after_s=1)
    release, order = asyncio.Event(), []

    first = asyncio.create_task(_hold(admission, release, order, "first"))
    await asyncio.sleep(0.01)
    doomed = asyncio.create_task(_hold(admission, release, order, "doomed"))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(_hold(admission, release, order, "second"))
    await asyncio.sleep(0.01)
    doomed.cancel()  # cancelled while queued
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 2)
    assert order == ["first", "second"] and admission.queued == 0
    # the slot is free again: one more runs at once, then a second
    release.clear()
    held = asyncio.create_task(_hold(admission, release, order, "third"))
    await asyncio.sleep(0.01)
    assert order[-1] == "third"
    release.set()
    await held


async def test_a_slot_handed_to_a_waiter_cancelled_in_the_same_step_is_passed_on():
    admission = Admission(max_active=1, max_queued=5, deadline_s=5, retry_after_s=1)
    release, order = asyncio.Event(), []

    tasks = [asyncio.create_task(_hold(admission, release, order, n)) for n in ("a", "b", "c")]
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.sleep(0)  # "a" leaves and hands its slot to "b" ...
    tasks[1].cancel()  # ... which is cancelled before it runs: "c" must get the slot
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 2)
    assert order == ["a", "c"] and isinstance(results[1], asyncio.CancelledError)
    async with admission.admit():  # and nothing leaked
        pass


async def test_a_waiter_cancelled_in_the_step_that_frees_its_slot_just_leaves():
    admission = Admission(max_active=1, max_queued=5, deadline_s=5, retry_after_s=1)
    go = asyncio.Event()

    async def waiter() -> None:
        async with admission.admit():
            pass

    queued = None

    async def holder() -> None:
        async with admission.admit():
            await go.wait()
            queued.cancel()  # the queued one is cancelled and, in the same step,
        # this exit frees the slot before the cancelled task has run

    first = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    queued = asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    go.set()
    await first
    with pytest.raises(asyncio.CancelledError):  # not a ValueError from the queue
        await queued
    assert admission.queued == 0
    async with asyncio.timeout(1):
        async with admission.admit():  # the slot is free
            pass


async def test_a_cancel_from_outside_stays_a_cancel_and_frees_the_slot():
    admission = Admission(max_active=1, max_queued=0, deadline_s=5, retry_after_s=1)
    release, started = asyncio.Event(), []
    task = asyncio.create_task(_hold(admission, release, started))
    await asyncio.sleep(0.02)
    task.cancel()  # the client went away: not a timeout
    with pytest.raises(asyncio.CancelledError):
        await task
    async with admission.admit():  # the slot came back
        pass


async def test_a_deadline_inside_an_outer_timeout_is_told_apart():
    admission = Admission(max_active=1, max_queued=0, deadline_s=5, retry_after_s=1)
    with pytest.raises(TimeoutError):  # the outer timeout fired first: not ours
        async with asyncio.timeout(0.05):
            async with admission.admit():
                await asyncio.sleep(1)
    inner = Admission(max_active=1, max_queued=0, deadline_s=0.05, retry_after_s=1)
    with pytest.raises(UpstreamTimeout):  # ours fired first, inside a longer outer one
        async with asyncio.timeout(5):
            async with inner.admit():
                await asyncio.sleep(1)


async def test_finishing_in_time_leaves_no_timer_behind():
    admission = Admission(max_active=1, max_queued=0, deadline_s=0.05, retry_after_s=1)
    async with admission.admit():
        pass
    await asyncio.sleep(0.1)  # past the deadline: nothing is cancelled any more
    assert not asyncio.current_task().cancelling()


@pytest.mark.parametrize(
    ("queued", "active", "max_active", "decision_s", "expected"),
    [
        (0, 1, 2, 0.5, 0.5),  # 2 served at once, 1 busy: just the decision
        (0, 16, 2, 0.5, 4.5),  # 16 admitted, 2 at once: 14 waiting, 8 rounds, then
        (3, 4, 2, 0.5, 2.0),  # 3 queued + 2 admitted waiting: 6 turns, 3 rounds, then
        (0, 3, 4, 0.5, 0.5),  # a slot is free: just the decision
        (0, 4, 4, 0.5, 1.0),  # all busy: a round's wait, then the decision
        (4, 4, 4, 0.5, 1.5),  # 5 ahead through 4 slots: two rounds
        (7, 4, 4, 0.5, 1.5),  # 8 ahead through 4 slots: two rounds, then its own
        (8, 4, 4, 0.5, 2.0),  # 9 ahead: three rounds
        (63, 16, 16, 0.5, 2.5),  # 64 ahead through 16 slots: 4 rounds, then its own
    ],
)
def test_estimated_finish(queued, active, max_active, decision_s, expected):
    assert estimated_finish_s(queued, active, max_active, decision_s) == expected


@pytest.mark.parametrize(
    ("mean", "sample", "expected"),
    [(None, 0.3, 0.3), (1.0, 0.0, 0.8), (0.5, 1.5, 0.7)],
)
def test_smoothed(mean, sample, expected):
    assert smoothed(mean, sample) == pytest.approx(expected, abs=1e-15)


async def test_a_request_that_cannot_finish_in_time_is_refused_at_once_with_an_estimate():
    admission = Admission(max_active=1, max_queued=10, deadline_s=2.0, retry_after_s=1)
    admission.decision_s = 0.5  # measured; the budget is 0.8 x 2.0 = 1.6 s
    release = asyncio.Event()

    async def hold():
        async with admission.admit():
            await release.wait()

    holders = [asyncio.create_task(hold()) for _ in range(3)]  # 1 running, 2 queued: 1.0, 1.5
    await asyncio.sleep(0)
    assert (admission.active, admission.queued) == (1, 2)
    with pytest.raises(Overloaded) as err:  # a third in the queue would finish at 2.0 s
        admission.admit()
    assert err.value.retry_after_s == 1  # ceil(2.0 - 1.6)
    assert "about 2.0 s, past this request's 2 s deadline" in err.value.message
    release.set()
    await asyncio.gather(*holders)
    assert admission.decision_s is not None and admission.decision_s < 0.5  # measured again


async def test_without_a_measurement_only_the_bounds_apply():
    admission = Admission(max_active=1, max_queued=10, deadline_s=0.001, retry_after_s=1)
    assert admission.decision_s is None
    admission.admit()  # nothing known yet: not refused on an estimate


class _Clock:
    """proxy.admission's clock, moved by the test: the measured time is exact, whatever
    else the machine is doing (CI has seen a busy core add milliseconds to a real sleep)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("waited_s", "elapsed_s", "taught_s"),
    [
        (0.25, 1.0, 0.75),  # the slot wait is taken out of what the decision took
        (0.0, 0.5, 0.5),  # no wait: the whole
        (1.5, 1.0, None),  # parallel waits overlapping past the whole teach nothing
    ],
)
async def test_time_spent_waiting_for_a_llama_server_slot_is_not_taught_as_decision_time(
    monkeypatch, waited_s, elapsed_s, taught_s
):
    clock = _Clock()
    monkeypatch.setattr("proxy.admission.time", clock)
    admission = Admission(max_active=4, max_queued=4, deadline_s=10, retry_after_s=1)
    facts = Facts(slot_wait_s=2.0)  # waits before this admission are not its own
    async with admission.admit(facts=facts):
        facts.slot_wait_s += waited_s  # what proxy/kv.py counts when a lease had to wait
        await asyncio.sleep(0)
        clock.now += elapsed_s
    assert admission.decision_s == taught_s


def test_behind_a_router_every_models_slots_count_once():
    admission = Admission(max_active=16, max_queued=8, deadline_s=10, retry_after_s=1)
    admission.limit_parallel(4, "smollm2")
    admission.limit_parallel(2, "qwen3-4b")
    assert admission.parallel == 6
    admission.limit_parallel(4, "smollm2")  # the same model's slots counted again: once
    assert admission.parallel == 6
    small = Admission(max_active=5, max_queued=8, deadline_s=10, retry_after_s=1)
    small.limit_parallel(4, "a")
    small.limit_parallel(4, "b")
    assert small.parallel == 5  # never more than are admitted at once


def test_finish_under_processor_sharing_in_llama_servers_slots():
    # 2 s of work beside 1 s and 5 s left, four slots: the first delays it by 1, the
    # second by 2
    assert finish_s(2.0, [1.0, 5.0], 4) == 5.0
    assert finish_s(3.0, [], 4) == 3.0
    # two slots taken by 3 s each: 6 s until both are done, then 1 s alone
    assert finish_s(1.0, [3.0, 3.0], 2) == 7.0
    # one slot: every request ahead runs whole first
    assert finish_s(1.0, [2.0, 0.5], 1) == 3.5


def test_decisions_finish_in_turns_of_llama_servers_slots():
    # 2 s of prompt beside 1 s and 5 s left, four slots: evaluated in the same batches,
    # all three finish together, when their 8 s are done (sharing would say 5 s)
    assert turns_s(2.0, [1.0, 5.0], 4) == 8.0
    assert finish_s(2.0, [1.0, 5.0], 4) == 5.0
    # five in four slots: the first four together, then this one alone
    assert turns_s(0.5, [1.0, 2.0, 3.0, 4.0], 4) == 10.5
    assert turns_s(3.0, [], 4) == 3.0


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The admission's monotonic clock, stopped at 1000 s until a test moves it."""
    now = [1000.0]
    monkeypatch.setattr(admission_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


async def test_a_short_decision_behind_long_ones_waits_for_them(clock):
    admission = Admission(max_active=16, max_queued=0, deadline_s=50, retry_after_s=1)
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(4):  # four long prompts of 9 s each, in the four slots together
            await stack.enter_async_context(admission.admit(Work(1400, 9.0)))
        # a 1 s question waits for their turn (36 s), then its own: 37 s, within the 40 s
        # admitted (80% of the 50 s deadline)
        await stack.enter_async_context(admission.admit(Work(128, 1.0)))
        # a second long one joins that turn: 36 + 1 + 9 = 46 s, past the 40 s
        with pytest.raises(Overloaded) as caught:
            admission.admit(Work(1400, 9.0))
        assert caught.value.message == (
            "this request needs about 1,400 prompt tokens, about 9 s on this server; with "
            "the work admitted ahead of it, it would finish in about 46 s, past the 40 s "
            "admitted within its 50 s deadline (a margin for the estimate's error); retry later"
        )
        assert caught.value.headers()["Retry-After"] == "6"


async def test_a_decision_is_refused_when_it_would_push_one_admitted_before_past_its_deadline(
    clock,
):
    admission = Admission(max_active=16, max_queued=0, deadline_s=50, retry_after_s=1)
    async with contextlib.AsyncExitStack() as stack:
        # admitted at 1000 s, estimated 30 s: it must finish by 1040 s (80% of 50 s)
        facts = Facts()
        await stack.enter_async_context(admission.admit(Work(1500, 30.0), facts=facts))
        assert facts.estimate == (Work(1500, 30.0), 30.0)  # for its Server-Timing header
        clock[0] += 10.0  # 10 s on, its prompt's first 500 tokens evaluated
        assert admission.ahead() == [30.0]  # how far it is comes from its reads, not time
        facts.evaluated += 500  # what proxy/reader.py counts as a step comes back
        assert admission.ahead() == [pytest.approx(20.0)]
        assert admission.budget_s() == pytest.approx(30.0)
        # 20 + 12 = 32 s would be within its own 40 s, but all admitted work is done
        # together, so the first would finish 2 s late: refused
        with pytest.raises(Overloaded) as caught:
            admission.admit(Work(400, 12.0))
        assert caught.value.message == (
            "this request needs about 400 prompt tokens, about 12 s on this server; with the "
            "work admitted ahead of it, it would finish in about 32 s, past the 30 s it may take "
            "beside the decisions admitted before it; retry later"
        )
        assert caught.value.headers()["Retry-After"] == "2"
        # past the 40 s too: named as such, but it waits until it fits beside the first
        with pytest.raises(Overloaded) as caught:
            admission.admit(Work(800, 25.0))
        assert "finish in about 45 s, past the 40 s admitted within its 50 s deadline" in (
            caught.value.message
        )
        assert caught.value.headers()["Retry-After"] == "15"
        # 20 + 9 = 29 s: admitted
        await stack.enter_async_context(admission.admit(Work(300, 9.0)))
        clock[0] += 10.0  # 20 s on: 20 s left for the first, but never under half the deadline
        assert admission.budget_s() == 25.0
        # 29 s of work ahead by the tokens (nothing more evaluated): refused before planning
        with pytest.raises(Overloaded) as caught:
            admission.crowded()
        assert "in about 29 s, past the 25 s it may take beside" in caught.value.message
    assert admission.budget_s() == pytest.approx(40.0)
    assert admission.budget_s() == pytest.approx(40.0)


async def test_work_that_cannot_finish_even_on_an_idle_server_is_a_client_error():
    admission = Admission(max_active=4, max_queued=4, deadline_s=50, retry_after_s=1)
    with pytest.raises(InvalidRequest) as caught:
        admission.admit(Work(3900, 62.4))
    assert caught.value.status == 400 and caught.value.code == "exceeds_deadline"
    assert caught.value.message.startswith(
        "this request needs about 3,900 prompt tokens, about 62 s on this server; "
        "the deadline is 50 s"
    )


async def test_work_that_waiting_would_let_finish_is_429_with_the_wait():
    admission = Admission(max_active=4, max_queued=4, deadline_s=50, retry_after_s=1)
    release, started = asyncio.Event(), []

    async def hold(seconds: float) -> None:
        async with admission.admit(Work(1000, seconds)):
            started.append(seconds)
            await release.wait()

    tasks = [asyncio.create_task(hold(s)) for s in (15.0, 15.0)]
    await asyncio.sleep(0.01)
    assert started == [15.0, 15.0]
    # 24 s alone would finish; beside 2 x 15 s ahead, about 54 s
    with pytest.raises(Overloaded) as caught:
        admission.admit(Work(800, 24.0))
    assert caught.value.status == 429
    assert "finish in about 54 s" in caught.value.message
    # once 14 s of the 30 s ahead are done, 16 + 24 s fit the 40 s admitted
    assert int(caught.value.headers()["Retry-After"]) == pytest.approx(14, abs=1)
    # within the 40 s with what is ahead: admitted
    async with admission.admit(Work(100, 4.0)):
        pass
    release.set()
    await asyncio.gather(*tasks)
    assert admission.ahead() == []
    async with admission.admit(Work(800, 24.0)):  # nothing ahead any more
        pass


def test_the_estimate_is_reported_in_server_timing_syntax():
    assert server_timing((Work(1234, 2.5), 3.25)) == (
        'semif-estimate;dur=3250;desc="1234 prompt tokens, 2.500 s idle"'
    )
    assert server_timing(None) is None


async def test_a_relayed_generation_counts_ahead_of_decisions():
    admission = Admission(max_active=4, max_queued=0, deadline_s=50, retry_after_s=1)
    async with admission.relayed(Work(100, 45.0), 120):
        assert admission.ahead() == [pytest.approx(45.0, rel=1e-3)]
        async with admission.relayed(Work(100, 45.0), 120):  # 90 s: within 120
            async with admission.admit(Work(50, 10.0)):  # 10 + 2 x 10: 30 s
                pass
            with pytest.raises(Overloaded):  # 20 + 2 x 20: 60 s
                admission.admit(Work(50, 20.0))
            with pytest.raises(Overloaded) as caught:  # 45 + 45 + 45: past 120 s
                async with admission.relayed(Work(100, 45.0), 120):
                    pass
            assert "would finish in about 135 s behind" in caught.value.message
            # its first token in 1 s beside them: 3 s, though all of it may take 200 s
            async with admission.relayed(Work(100, 200.0, first_s=1.0), 120):
                pass
    assert admission.ahead() == []
    async with admission.admit(Work(50, 20.0)):
        pass


async def test_a_long_generation_on_an_idle_server_is_not_refused_for_its_own_length():
    admission = Admission(max_active=4, max_queued=4, deadline_s=50, retry_after_s=1)
    async with admission.relayed(Work(30, 143.0, first_s=0.3), 55):  # 2048 tokens at most
        assert admission.ahead() == [pytest.approx(143.0, rel=1e-3)]


async def test_a_timeout_of_the_works_own_is_not_the_deadline():
    admission = Admission(max_active=1, max_queued=0, deadline_s=5, retry_after_s=1)
    with pytest.raises(TimeoutError):  # not UpstreamTimeout: the deadline did not pass
        async with admission.admit():
            raise TimeoutError
    async with admission.admit():  # and the place came back
        pass


@pytest.mark.parametrize("seed", range(5))
async def test_places_come_back_exactly_once_whatever_is_cancelled_when(seed):
    import random

    rng = random.Random(seed)
    admission = Admission(max_active=3, max_queued=50, deadline_s=0.05, retry_after_s=1)

    async def one() -> None:
        async with admission.admit():
            await asyncio.sleep(rng.choice((0, 0.001, 0.1)))  # 0.1: past the deadline

    tasks = [asyncio.create_task(one()) for _ in range(40)]
    for task in tasks:
        if rng.random() < 0.3:
            await asyncio.sleep(rng.choice((0, 0.001)))
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert (admission.active, admission.queued) == (0, 0)
    # what the storm measured per decision is not under test: on a loaded machine a 1 ms
    # sleep can be measured at over the deadline's 80%, and the holders refused (429)
    admission.decision_s = None
    release, started = asyncio.Event(), []
    holders = [asyncio.create_task(_hold(admission, release, started)) for _ in range(4)]
    await asyncio.sleep(0.01)
    assert len(started) == 3 and admission.queued == 1  # three places, no more, no fewer
    release.set()
    await asyncio.gather(*holders)


def _cost(chunk_s: float, one_s: float) -> CostModel:
    """A cost model that measured a 100-token chunk in ``chunk_s`` and a one-token read
    in ``one_s`` (nothing around them)."""
    cost = CostModel()
    cost.observe(CHUNK, 100, 0, upstream_s=chunk_s, wall_s=chunk_s)
    cost.observe(ONE, 1, 100, upstream_s=one_s, wall_s=one_s)
    return cost


@pytest.mark.parametrize(
    ("body", "first_s"),
    [
        ({"messages": [], "max_tokens": 64}, None),  # a whole answer of 64 named tokens
        ({"messages": [], "max_tokens": 64, "stream": True}, 0.5 + 0.02),  # its first token
        ({"messages": []}, 0.5 + 0.02),  # no length named: the cap bounds it
    ],
)
def test_a_relayed_generation_is_judged_by_what_its_client_waits_for(body, first_s):
    raw = b"x" * 400  # about 100 prompt tokens
    work = relayed_cost("/v1/chat/completions", body, raw, 2048, _cost(0.5, 0.02), ubatch=63)
    out = 64 if "max_tokens" in body else 2048
    # beside a decision's prompt each token waits for an iteration carrying 63 of its
    # tokens: 63 x 0.005 s (the chunk's cost per token) = 0.315 s
    paced = pytest.approx(0.5 + out * 0.315, rel=1e-9)
    assert work == Work(100, pytest.approx(0.5 + out * 0.02, rel=1e-9), first_s, paced)
    # -ub unknown: llama-server's default of 512 tokens an iteration, 2.56 s
    unknown = relayed_cost("/v1/chat/completions", body, raw, 2048, _cost(0.5, 0.02))
    assert unknown.paced_s == pytest.approx(0.5 + out * 2.56, rel=1e-9)
    assert relayed_cost("/v1/chat/completions", body, raw, 2048, CostModel()) is None
    assert relayed_cost("/v1/models", body, raw, 2048, _cost(0.5, 0.02)) is None


async def test_a_crowded_server_refuses_before_anything_is_planned():
    admission = Admission(max_active=4, max_queued=8, deadline_s=50, retry_after_s=1)
    admission.crowded()  # nothing admitted: nothing to refuse
    async with contextlib.AsyncExitStack() as stack:
        # generations of up to 143 s each, admitted on their first token (0.3 s)
        for _ in range(3):
            await stack.enter_async_context(admission.relayed(Work(30, 143.0, first_s=0.3), 55))
        admission.crowded()  # a slot is free: a request arriving now starts at once
        await stack.enter_async_context(admission.relayed(Work(30, 143.0, first_s=0.3), 55))
        # every slot generating: one more waits for the first of them, 4 x 143 s
        with pytest.raises(Overloaded) as caught:
            admission.crowded()
        assert caught.value.status == 429
        assert "about 572 s, past the 40 s admitted within its 50 s deadline" in (
            caught.value.message
        )
    admission.crowded()


async def test_a_decision_counts_a_generation_ahead_as_long_as_it_holds_its_slot():
    admission = Admission(max_active=4, max_queued=8, deadline_s=50, retry_after_s=1)
    generation = Work(30, 2.0, first_s=None, paced_s=30.0)  # 2 s alone, 30 s beside a prompt
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(8):  # each judged by its 2 s: 8 x 2 s shared among 4 slots
            await stack.enter_async_context(admission.relayed(generation, 55))
        # no decision admitted: nothing evaluates a prompt beside them, they keep their pace
        assert admission.ahead(paced=True) == pytest.approx([2.0] * 8, rel=1e-3)
        await stack.enter_async_context(admission.admit(Work(100, 1.0)))
        # with one admitted (1 s left of its own), a decision sees each hold its slot 30 s:
        # 30 / 4 = 7.5 s of shared work each; the last four free their slots after 60 s
        assert admission.ahead(paced=True) == pytest.approx([1.0] + [7.5] * 8, rel=1e-3)
        with pytest.raises(Overloaded) as caught:
            admission.admit(Work(100, 1.0))
        assert caught.value.status == 429
        with pytest.raises(Overloaded):
            admission.crowded()
        # by their work alone it would have fitted
        assert finish_s(1.0, admission.ahead(), 4) < 20
    async with admission.admit(Work(100, 1.0)):  # the generations gone: admitted
        pass


# -- a request's own deadline (proxy/deadlines.py) --------------------------------------


@pytest.mark.parametrize(
    ("deadline", "outcome"),
    [
        (None, "the deadline is 50 s: send"),  # the admission's own
        (Deadline(50.0, 3600.0), "the deadline is 50 s: send"),  # the server's, as routes give it
        (Deadline(120.0, 3600.0, "X-Semif-Deadline"), "admitted"),
        (Deadline(62.4, 3600.0, "X-Semif-Deadline"), "admitted"),  # its whole deadline, alone
        (Deadline(30.0, 3600.0, "X-Stainless-Read-Timeout"), "the deadline is 30 s (X-Stainless"),
    ],
)
async def test_the_refusal_at_once_is_judged_by_the_requests_own_deadline(deadline, outcome):
    admission = Admission(max_active=4, max_queued=4, deadline_s=50, retry_after_s=1)
    work = Work(3900, 62.4)
    if outcome == "admitted":
        async with admission.admit(work, deadline):
            pass
        return
    with pytest.raises(InvalidRequest) as caught:
        admission.admit(work, deadline)
    assert caught.value.code == "exceeds_deadline"
    assert outcome in caught.value.message
    assert caught.value.message.endswith(
        "or start the proxy with a longer --decision-deadline-s"
        if deadline is None
        else "or send a longer X-Semif-Deadline (at most 3600 s)"
    )


async def test_the_requests_own_deadline_cuts_the_work_and_is_named():
    admission = Admission(max_active=1, max_queued=0, deadline_s=50, retry_after_s=1)
    with pytest.raises(UpstreamTimeout) as caught:
        async with admission.admit(None, Deadline(0.05, 3600.0, "X-Semif-Deadline")):
            await asyncio.sleep(1)
    assert caught.value.message == "the decision did not finish within the 0.05 s deadline"


async def test_a_long_deadline_beside_short_ones_keeps_to_their_budget(clock):
    admission = Admission(max_active=16, max_queued=0, deadline_s=50, retry_after_s=1)
    long = Deadline(3600.0, 3600.0, "X-Semif-Deadline")
    async with contextlib.AsyncExitStack() as stack:
        # a 50 s decision admitted at 1000 s must finish by 1040 s (80% of 50 s)
        await stack.enter_async_context(admission.admit(Work(1500, 30.0)))
        clock[0] += 10.0
        # a long deadline's own budget would be 2880 s, its floor 1800 s: the short one's
        # 30 s left and its floor of 25 s bound it instead
        assert admission.budget_s(deadline_s=3600.0) == pytest.approx(30.0)
        with pytest.raises(Overloaded) as caught:
            admission.admit(Work(4000, 100.0), long)
        assert "it would finish in about 130 s, past the 30 s it may take beside" in (
            caught.value.message
        )
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(admission.admit(Work(4000, 100.0), long))
        with pytest.raises(Overloaded) as caught:
            admission.admit(Work(100, 1.0))
        assert caught.value.message.endswith(
            "it would finish in about 101 s, past the 40 s admitted within its 50 s deadline "
            "(a margin for the estimate's error); retry later"
        )
        # another long one fits beside it
        await stack.enter_async_context(admission.admit(Work(100, 1.0), long))
        with pytest.raises(Overloaded):
            admission.crowded()  # nothing fits the server's 50 s behind 100 s of work
        admission.crowded(long)
