"""The decision service with a recorded upstream: labels, widening, exactness."""

import asyncio
import math
import re
import zlib
from dataclasses import replace

import pytest

from proxy.admission import Admission
from proxy.cost import CHUNK, ONE
from proxy.decision.prompt import DEFAULT_LAYOUT
from proxy.decision.question import choice_question, score_question
from proxy.errors import InvalidRequest, UpstreamBadResponse, UpstreamTimeout
from proxy.facts import Facts
from proxy.kv import common_prefix
from proxy.reading import read_widths
from proxy.service import Asked, DecisionService
from proxy.upstream import Completion, Lanes, ModelInfo, NextToken

CONTEXT = "<|im_end|>\n<|im_start|>assistant\n"
# Recorded from SmolLM2-135M: single letters are one token each after the header.
TOKENS = {CONTEXT: [2, 198, 1, 520, 9531, 198]}
TOKENS.update({CONTEXT + c: [*TOKENS[CONTEXT], 49 + i] for i, c in enumerate("ABCDEFG")})
TOKENS[CONTEXT + "B"] = [*TOKENS[CONTEXT], 49, 49]  # pretend "B" is two tokens


class RecordedUpstream:
    """Recorded reads, served through a simulated llama-server slot cache: a request
    reuses the longest common prefix with its slot's tokens (all but the last token
    when the whole prompt is cached, as llama-server does). ``Upstream``'s interface:
    ``epoch`` (llama-server never restarts here) and ``lanes`` (calls in flight)."""

    def __init__(self, reads):
        self.reads = list(reads)  # one dict of logprobs per read, in order
        self.widths = []
        self.epoch = 0
        self.lanes = Lanes()
        self.model = "smollm2"
        self.n_ctx = 16384  # tokens a slot holds (tokenised here one per character)
        self.renders = 0  # the label probe's renders
        self.slots: dict[int, list[int]] = {}
        self.requests = []  # (slot, tokens sent, cache_prompt, reused, evaluated)

    async def model_info(self, facts=None):
        return ModelInfo(self.model, 49152, self.n_ctx)

    async def total_slots(self, facts=None):
        return 2

    async def identity(self):  # what a kept self-check verdict is keyed by (in part)
        return {"model": self.model}

    async def render(self, messages, kwargs, facts=None):
        assert kwargs["enable_thinking"] is False
        content = messages[-1]["content"]
        self.renders += content.startswith("Question.")
        return "<|im_start|>user\n" + content + CONTEXT

    async def tokenize(self, text, *, special=False, facts=None):
        return TOKENS.get(text) or [ord(c) for c in text]  # one token per character

    async def complete(self, tokens, *, slot, cache, n_probs=0, facts=None):
        held = self.slots.get(slot, []) if cache else []
        reused = min(common_prefix(held, tokens), len(tokens) - 1)
        self.slots[slot] = list(tokens)
        self.requests.append((slot, list(tokens), cache, reused, len(tokens) - reused))
        read = {}
        if n_probs:
            self.widths.append(n_probs)
            self.last_prompt = "".join(map(chr, tokens))
            read = self.reads.pop(0)
        return Completion(NextToken(read, self.model, len(tokens), len(tokens) - reused), reused)


async def decide(
    service, messages, question, template_kwargs=None, *, debias=(), contextual=False, facts=None
):
    """One question asked about a conversation through ``DecisionService.answer``, neither
    calibrated nor routed: ``debias``, the cyclic shifts to read and average;
    ``contextual``, the content-free answer divided out."""
    asked = Asked(
        messages,
        {"0": question},
        template_kwargs,
        DEFAULT_LAYOUT,
        default_profile=False,
        debias_method="contextual" if contextual else "cyclic" if debias else None,
        debias={"0": tuple(debias)} if debias else {},
    )
    return (await service.answer(asked, facts or Facts()))["0"]


@pytest.mark.parametrize(
    ("first", "n", "vocab", "expected"),
    [
        (64, 3, 49152, [64, 1024, 49152]),
        (64, 255, 49152, [1020, 4080, 49152]),
        (64, 3, 500, [64, 500]),
        (2000, 3, 49152, [2000, 49152]),
        (64, 3, None, [64, 1024, 1 << 18]),
    ],
)
def test_read_widths(first, n, vocab, expected):
    assert read_widths(first, n, vocab) == expected


async def test_labels_skip_multi_token_candidates():
    up = RecordedUpstream([{49: math.log(0.2), 51: math.log(0.1), 52: math.log(0.1)}])
    out = await decide(
        DecisionService(up, n_probs=8),
        [{"role": "user", "content": "route it"}],
        choice_question(["x", "y", "z"]),
    )
    assert out.labels == ("A", "C", "D")
    assert "A: x\nC: y\nD: z" in up.last_prompt
    assert out.decision.probabilities == pytest.approx((0.5, 0.25, 0.25), rel=1e-12)
    assert out.decision.label_mass == pytest.approx(0.4, rel=1e-12)
    prompt = len(up.last_prompt)
    assert (out.reads, out.prompt_tokens, out.prompt_evaluated) == (1, prompt, prompt)


async def test_missing_label_is_fetched_by_a_wider_read_not_guessed():
    first = {49: -0.1, 51: -2.0}  # "D" (52) absent from the top-k
    wider = {49: -0.2, 51: -2.5, 52: -9.0}  # the values used must all come from this read
    up = RecordedUpstream([first, wider])
    out = await decide(
        DecisionService(up, n_probs=8),
        [{"role": "user", "content": "q"}],
        choice_question(["x", "y", "z"]),
    )
    assert up.widths == [12, 1024]
    expected = [math.exp(v) / sum(math.exp(w) for w in wider.values()) for v in wider.values()]
    assert out.decision.probabilities == pytest.approx(expected, rel=1e-12)
    # the wider read finds the prompt cached and evaluates its last token again
    assert (out.reads, out.prompt_evaluated) == (2, len(up.last_prompt) + 1)


async def test_label_absent_from_the_whole_vocabulary_is_an_upstream_error():
    up = RecordedUpstream([{49: -0.1}] * 3)
    with pytest.raises(UpstreamBadResponse, match="no log-probability"):
        await decide(
            DecisionService(up, n_probs=8),
            [{"role": "user", "content": "q"}],
            choice_question(["x", "y"]),
        )
    assert up.widths == [8, 1024, 49152]


async def test_labels_are_verified_once_per_template():
    up = RecordedUpstream([{49: -1.0, 51: -1.0}] * 2)
    service = DecisionService(up, n_probs=8)
    for _ in range(2):
        await decide(service, [{"role": "user", "content": "q"}], choice_question(["x", "y"]))
    assert up.renders == 1


async def test_a_model_change_forgets_remembered_labels_and_verifies_again():
    up = RecordedUpstream([{49: -1.0, 51: -2.0}] * 3)
    service = DecisionService(up, n_probs=8)
    question = choice_question(["x", "y"])
    first = await decide(service, [{"role": "user", "content": "q"}], question)
    up.model = "another"  # the next read comes from another model: verify again, then read
    second = await decide(service, [{"role": "user", "content": "q"}], question)
    assert first.model == "smollm2" and second.model == "another"
    assert up.renders == 2 and second.labels == ("A", "C")


async def test_remembered_layouts_give_the_same_read_as_fresh_ones():
    up = RecordedUpstream([{49: -1.0, 51: -2.0, 52: -3.0}] * 3)
    service = DecisionService(up, n_probs=8)
    sent = []
    for options in (["x", "y", "z"], ["x", "y", "z"], ["x", "z", "y"]):
        await decide(service, [{"role": "user", "content": "q"}], choice_question(options))
        sent.append(up.last_prompt)
    assert sent[0] == sent[1]
    assert sent[2] != sent[0] and "A: x\nC: z\nD: y" in sent[2]


async def test_labels_verified_for_a_model_that_was_replaced_meanwhile_are_not_reused():
    up = RecordedUpstream([{49: -1.0, 51: -2.0}] * 4)
    service = DecisionService(up, n_probs=8)
    question = choice_question(["x", "y"])
    await decide(service, [{"role": "user", "content": "q"}], question)
    old = service.discovery.known
    service._preparation.forget()  # another request saw a new model and asked for it ...
    up.model = "another"
    await service.discovery.model()
    # ... while a request verifying labels for the old one wrote its result late
    service._preparation._catalogue._assigned[('{"enable_thinking":false}', 2)] = (
        old,
        (("A", 1), ("C", 2)),
    )
    out = await decide(service, [{"role": "user", "content": "q"}], question)
    assert out.model == "another" and out.labels == ("A", "C")
    assert out.decision.probabilities[0] > 0.5  # ids 49 and 51, not the stale 1 and 2


async def test_very_long_option_layouts_are_not_remembered():
    up = RecordedUpstream([{49: -1.0, 51: -2.0}] * 2)
    service = DecisionService(up, n_probs=8)
    for options in (["x", "y"], ["x" * 9000, "y"]):
        await decide(service, [{"role": "user", "content": "q"}], choice_question(options))
    assert [key[2][0][:3] for key in service._preparation._prompts._layouts] == ["x"]


class MeddledUpstream(RecordedUpstream):
    """Another client empties the slot before every request the proxy sends."""

    async def complete(self, tokens, *, slot, cache, n_probs=0, facts=None):
        self.slots[slot] = []
        return await super().complete(tokens, slot=slot, cache=cache, n_probs=n_probs)


async def test_a_slot_that_keeps_changing_still_gets_its_read_and_it_is_counted():
    from proxy.metrics import Metrics

    up, metrics = MeddledUpstream([{49: -1.0, 51: -2.0}]), Metrics()
    service = DecisionService(up, n_probs=8, metrics=metrics)
    out = await decide(service, [{"role": "user", "content": "q"}], choice_question(["x", "y"]))
    assert out.labels == ("A", "C") and out.reads == 1
    assert metrics.unrepeatable_reads._value.get() == 1
    # two plans cut short after their cold segment, then one read as it comes
    assert [cache for _, _, cache, _, _ in up.requests] == [False, True, False, True, True]


async def test_concurrent_first_decisions_share_one_slot_book():
    up = RecordedUpstream([{49: -1.0, 51: -2.0}] * 8)
    service = DecisionService(up, n_probs=8)
    question = choice_question(["x", "y"])
    outs = await asyncio.gather(
        *(decide(service, [{"role": "user", "content": f"q{i}"}], question) for i in range(8))
    )
    assert len(outs) == 8
    # no request found its slot other than the book said: no read started again
    assert [cache for _, _, cache, _, _ in up.requests].count(False) == 8


async def test_contextual_calibration_reads_the_content_free_answer_once_per_model():
    ln = math.log
    main, free = {49: ln(0.6), 51: ln(0.4)}, {49: ln(0.8), 51: ln(0.2)}
    up = RecordedUpstream([main, free, main, {49: -1.0, 51: -1.0}, main, free])
    service = DecisionService(up, n_probs=8)
    question = choice_question(["x", "y"])
    first = await decide(service, [{"role": "user", "content": "q1"}], question, contextual=True)
    assert "N/A" in up.last_prompt and first.debias == "contextual" and first.reads == 2
    # (0.6 / 0.8, 0.4 / 0.2) = (0.75, 2), normalised
    assert first.decision.probabilities == pytest.approx((0.75 / 2.75, 2 / 2.75), rel=1e-12)
    assert first.decision.best == 1
    second = await decide(service, [{"role": "user", "content": "q2"}], question, contextual=True)
    assert second.reads == 1  # the same template: remembered
    up.model = "another"  # its content-free answer is its own: read again
    third = await decide(service, [{"role": "user", "content": "q3"}], question, contextual=True)
    assert third.model == "another" and third.reads == 2 and up.reads == []


@pytest.mark.parametrize("costs_known", [False, True])
async def test_a_prompt_longer_than_a_slot_is_refused_with_both_counts(costs_known):
    up = RecordedUpstream([{49: -1.0, 51: -2.0}])
    up.n_ctx = 64
    admission = Admission(max_active=4, max_queued=4, deadline_s=1, retry_after_s=1)
    service = DecisionService(up, n_probs=8, admission=admission)
    if costs_known:  # a second a token: admission would refuse it as past the deadline first
        service.reader.cost.observe(CHUNK, 10, 0, upstream_s=10.0, wall_s=10.0)
    with pytest.raises(InvalidRequest) as err:
        await decide(service, [{"role": "user", "content": "q" * 100}], choice_question(["x", "y"]))
    assert err.value.code == "context_length_exceeded" and err.value.status == 400
    needed = int(re.search(r"the prompt needs (\d+) tokens", err.value.message).group(1))
    assert needed > 100 and "a llama-server slot holds 64" in err.value.message
    assert up.requests == []  # refused before anything was evaluated


async def test_a_decision_makes_each_prompt_once_for_its_estimate_and_its_read():
    up = CountingUpstream([{49: -1.0, 51: -2.0}] * 3)
    service = DecisionService(up, n_probs=8, ubatch=63)
    service.reader.cost.observe(CHUNK, 10, 0, upstream_s=0.01, wall_s=0.01)  # admission estimates
    made = []
    prompt = service._preparation._prompts.prompt

    async def counted(convo, block, kwargs, ubatch, facts=None):
        made.append(ubatch)
        return await prompt(convo, block, kwargs, ubatch, facts)

    service._preparation._prompts.prompt = counted
    asked = Asked(
        [{"role": "user", "content": "Ticket 1001: late parcel"}],
        {"a": choice_question(["x", "y"]), "b": choice_question(["y", "x"])},
    )
    answered = await service.answer(asked, Facts())
    assert made == [63, 63]  # one per question, made by the estimate, taken by the read
    assert [list(o.prompt_ids) for o in answered.values()] == [r[1] for r in up.requests]
    # each question read its own prompt (labels A and C: "B" is two tokens here)
    assert "A: x\nC: y" in "".join(map(chr, answered["a"].prompt_ids))
    assert "A: y\nC: x" in "".join(map(chr, answered["b"].prompt_ids))
    # the read scheme changed between the estimate and the read (a failed self-check):
    # the read makes its prompt again, for the scheme it reads with
    work = service._preparation.estimate

    async def then_segment(*args, **kwargs):
        found = await work(*args, **kwargs)
        service.reader.ubatch = 0
        return found

    service._preparation.estimate = then_segment
    made.clear()
    before = len(up.requests)
    again = await decide(service, asked.messages, asked.questions["a"])
    assert made == [63, 0] and again.read_scheme == "segment"
    # read the segment scheme's way: its shared segment first, cold
    (_, segment, cache, _, _), *_rest = up.requests[before:]
    assert not cache and len(segment) < len(again.prompt_ids)


async def test_a_prompt_made_before_the_model_changed_is_made_again_not_read():
    # another request found a new model while this one waited for admission: the read
    # takes the new model's labels and tokens rather than read the old prompt once in vain
    up = RecordedUpstream([{49: -1.0, 51: -2.0}] * 3)
    service = DecisionService(up, n_probs=8, ubatch=63)
    service.reader.cost.observe(CHUNK, 10, 0, upstream_s=0.01, wall_s=0.01)  # admission estimates
    convo, question = [{"role": "user", "content": "Ticket 1001"}], choice_question(["x", "y"])
    await decide(service, convo, question)
    work = service._preparation.estimate

    async def then_another_model(*args, **kwargs):
        found = await work(*args, **kwargs)
        up.model = "another"
        service._preparation.forget()  # as a read of the other request did on seeing it
        return found

    service._preparation.estimate = then_another_model
    reads = len(up.widths)
    out = await decide(service, convo, question)
    assert out.model == "another" and out.reads == 1 and len(up.widths) == reads + 1


class CountingUpstream(RecordedUpstream):
    """Counts the /tokenize calls of prompts (the label probe's are not counted)."""

    def __init__(self, reads):
        super().__init__(reads)
        self.tokenized = 0

    async def tokenize(self, text, *, special=False, facts=None):
        self.tokenized += special
        return await super().tokenize(text, special=special)


async def test_the_prefix_scheme_reads_a_new_conversation_in_one_request():
    up = CountingUpstream([{49: -1.0, 51: -2.0}] * 2)
    service = DecisionService(up, n_probs=8, ubatch=63)
    question = choice_question(["x", "y"])
    await decide(service, [{"role": "user", "content": "Ticket 1001: late parcel"}], question)
    first = up.requests[:]
    await decide(service, [{"role": "user", "content": "Ticket 1002: charged twice"}], question)
    # one request, reusing whatever the slot holds (nothing: all of it evaluated)
    ((slot, sent, cache, reused, evaluated),) = first
    assert (cache, reused, evaluated) == (True, 0, len(sent))
    # the second conversation lands in the same slot and reuses the prefix it holds
    ((slot2, sent2, cache2, reused2, evaluated2),) = up.requests[len(first) :]
    shared = common_prefix(sent, sent2)
    assert (slot2, cache2, reused2, evaluated2) == (slot, True, shared, len(sent2) - shared)
    assert shared == len("<|im_start|>user\nTicket 100")
    assert up.tokenized == 2  # one /tokenize per new prompt: no segment tokenised apart


async def test_a_short_prompt_on_the_prefix_scheme_takes_whatever_its_slot_holds():
    # within the first 256 cells every row goes through one kernel, whoever evaluated it
    # (docs/repeatability.md): a slot changed under the proxy's record is no reason to read
    # again, and a read queued behind another one in its slot cannot know what it will find
    up = RecordedUpstream([{49: -1.0, 51: -2.0}] * 2)
    service = DecisionService(up, n_probs=8, ubatch=63)
    question = choice_question(["x", "y"])
    convo = [{"role": "user", "content": "Ticket 1001: late parcel"}]
    first = await decide(service, convo, question)
    ((slot, sent, *_),) = up.requests
    up.slots[slot] = sent[:5] + [0] * 20  # someone else's tokens after the first five
    again = await decide(service, convo, question)
    assert up.requests[1] == (slot, sent, True, 5, len(sent) - 5)  # one request, no restart
    assert again.decision.probabilities == first.decision.probabilities


async def test_the_prefix_scheme_reads_a_long_prompt_as_all_but_the_last_then_the_last():
    up = RecordedUpstream([{49: -1.0, 51: -2.0}] * 2)
    service = DecisionService(up, n_probs=8, ubatch=63)
    question = choice_question(["x", "y"])
    out = await decide(service, [{"role": "user", "content": "w" * 400}], question)
    (_, a, cache_a, _, eval_a), (_, b, cache_b, reused_b, eval_b) = up.requests
    assert (len(a), cache_a, eval_a) == (len(b) - 1, False, len(b) - 1)
    assert (cache_b, reused_b, eval_b) == (True, len(b) - 1, 1)
    assert out.prompt_evaluated == len(b) and out.reads == 1
    # a replay is one request that evaluates the last token again
    await decide(service, [{"role": "user", "content": "w" * 400}], question)
    assert up.requests[-1][2:] == (True, len(b) - 1, 1) and len(up.requests) == 3


async def test_a_changed_slot_whose_last_row_went_alone_is_not_built_on():
    # the first request of a new long read finds its slot changed, and evaluates what is
    # left in pieces of 63 whose last is one token past 256 cells: that row went alone,
    # so what follows drops it and evaluates it again with another (kv.plan_prefix)
    question = choice_question(["x", "y"])
    before_it, convo = (
        [{"role": "user", "content": "w" * 400}],
        [{"role": "user", "content": "w" * 300 + "v" * 100}],
    )
    untouched = RecordedUpstream([SAME] * 2)  # the same two decisions, nobody meddling
    quiet = DecisionService(untouched, n_probs=8, ubatch=63)
    await decide(quiet, before_it, question)
    start = len(untouched.requests)
    await decide(quiet, convo, question)
    (slot, step, *_), prompt = untouched.requests[start], untouched.requests[-1][1]
    length = len(step)  # the plan's first request
    found = length - 1 - 63 * math.ceil((length - 1 - 256) / 63)  # at most 256
    up = RecordedUpstream([SAME] * 2)
    service = DecisionService(up, n_probs=8, ubatch=63)
    await decide(service, before_it, question)
    up.slots[slot] = prompt[:found] + [0] * 20  # someone else's tokens after ``found``
    start = len(up.requests)
    out = await decide(service, convo, question)
    mismatched, after, *_, last = up.requests[start:]
    assert mismatched == (slot, step, True, found, length - found)
    assert (length - found - 1) % 63 == 0 and length > 256  # its last row went alone
    assert after[3] <= length - 1  # what follows is not built on that row
    assert last == (slot, prompt, True, len(prompt) - 1, 1)
    assert out.reads == 1


SAME = {49: -0.5, 51: -1.25, 52: -2.0}
MOVED = {49: -0.5, 51: -1.2500001, 52: -2.0}  # one float differs in its last digits


@pytest.mark.parametrize("foreign", [5, 256, 257, 300])
async def test_a_long_prompt_on_a_changed_slot_reads_on_from_rows_within_256_cells(foreign):
    # someone else's request left the slot holding the first ``foreign`` tokens of the
    # prompt, then other tokens: rows within the first 256 cells went through the per-row
    # kernel whoever evaluated them, so the read goes on from what its own request left;
    # past them a row of theirs may have gone alone, so the read starts from position 0
    up = RecordedUpstream([SAME] * 3)
    service = DecisionService(up, n_probs=8, ubatch=63)
    question, convo = choice_question(["x", "y"]), [{"role": "user", "content": "w" * 400}]
    first = await decide(service, convo, question)
    (slot, sent, *_) = up.requests[-1]
    n, before = len(sent), len(up.requests)
    up.slots[slot] = sent[:foreign] + [0] * 20
    again = await decide(service, convo, question)
    planned = (slot, sent, True, foreign, n - foreign)  # a replay planned, this found
    if foreign <= 256:  # then the last row alone, as a replay reads it
        assert up.requests[before:] == [planned, (slot, sent, True, n - 1, 1)]
    else:  # all but the last from position 0, then the last alone
        assert up.requests[before:] == [
            planned,
            (slot, sent[:-1], False, 0, n - 1),
            (slot, sent, True, n - 1, 1),
        ]
    assert again.decision == first.decision and up.widths == [8, 8, 8]


async def test_the_self_check_passes_when_every_way_reads_the_same():
    up = RecordedUpstream([SAME] * 6)  # four reads of the known prompt, two of others
    check = await DecisionService(up, n_probs=8, ubatch=63).self_check.check()
    assert (check.scheme, check.repeatable, check.detail) == (
        "prefix-63",
        True,
        "4 reads identical",
    )
    slots = [slot for slot, *_ in up.requests]
    assert set(slots) == {0, 1}  # the other-slot read in the other slot


@pytest.mark.parametrize(
    "reads, way",
    [
        ([SAME, SAME, MOVED, SAME, SAME, SAME], "after another conversation in the same slot"),
        ([SAME, SAME, SAME, MOVED, SAME, SAME], "as a replay"),
        ([SAME, SAME, SAME, SAME, SAME, MOVED], "in another slot"),
    ],
)
async def test_the_self_check_fails_on_a_server_whose_numbers_move(reads, way):
    up = RecordedUpstream(reads)
    check = await DecisionService(up, n_probs=8, ubatch=63).self_check.check()
    assert check.repeatable is False
    assert check.detail.startswith(f"the read {way} differs from the one from an unknown slot")
    assert "largest log-probability change 1e-07" in check.detail


FAILING = [SAME, SAME, MOVED, SAME, SAME, SAME]  # a self-check whose second read moved


@pytest.fixture
def no_pause(monkeypatch):
    """A failed self-check is made again at once."""
    monkeypatch.setattr("proxy.checking.CHECK_PAUSE_S", (0.0, 0.0))


async def test_a_self_check_that_fails_once_is_made_again_and_passes(no_pause, caplog):
    up = RecordedUpstream(FAILING + [SAME] * 6 + [SAME])
    service = DecisionService(up, n_probs=8, ubatch=63)
    with caplog.at_level("INFO", logger="proxy"):
        await service.self_check.run()
    # another slot's reads in the same batches moved it once: the prefix scheme stays
    assert (service.reader.scheme, service.self_check.result.repeatable) == ("prefix-63", True)
    assert "failed (the read after another conversation in the same slot differs" in caplog.text
    assert "attempt 1 of 3; checking again" in caplog.text
    out = await decide(service, [{"role": "user", "content": "q"}], choice_question(list("xyz")))
    assert (out.read_scheme, out.repeatable) == ("prefix-63", True)


async def test_a_failed_prefix_check_falls_back_to_the_segment_scheme_and_answers_say_so(no_pause):
    from proxy.metrics import Metrics

    metrics = Metrics()
    up = RecordedUpstream(FAILING * 3 + [SAME] * 6 + [SAME])
    service = DecisionService(up, n_probs=8, ubatch=63, metrics=metrics)
    assert service.self_check.result.repeatable is None
    await service.self_check.run()
    assert (service.reader.scheme, service.self_check.result.repeatable) == ("segment", True)
    assert metrics.repeatable.labels("smollm2")._value.get() == 1.0
    out = await decide(service, [{"role": "user", "content": "q"}], choice_question(list("xyz")))
    assert (out.read_scheme, out.repeatable) == ("segment", True)


async def test_answers_say_repeatable_false_when_the_check_failed(no_pause):
    up = RecordedUpstream(FAILING * 3 + [MOVED])
    service = DecisionService(up, n_probs=8)  # the segment scheme: nothing to fall back to
    await service.self_check.run()
    out = await decide(service, [{"role": "user", "content": "q"}], choice_question(list("xyz")))
    assert (out.read_scheme, out.repeatable) == ("segment", False)


class CutUpstream(RecordedUpstream):
    """A llama-server whose next request is cut short after ``keep`` of its tokens were
    evaluated (a deadline that passed while it worked): they stay in the slot."""

    keep: int | None = None

    async def complete(self, tokens, *, slot, cache, n_probs=0, facts=None):
        if self.keep is not None:
            keep, self.keep = self.keep, None
            self.slots[slot] = list(tokens[:keep])
            self.requests.append((slot, list(tokens), cache, None, None))
            raise UpstreamTimeout("the decision did not finish within the 1 s deadline")
        return await super().complete(tokens, slot=slot, cache=cache, n_probs=n_probs)


@pytest.mark.parametrize(
    "kept",
    [
        lambda n: 150,  # some of the prompt
        lambda n: n - 1 - 63,  # the rest is one piece of 63 and the last row alone
        lambda n: n - 1,  # all but the last token
    ],
)
async def test_a_retry_after_a_cut_read_evaluates_only_what_the_slot_did_not_keep(kept):
    question = choice_question(["x", "y"])
    convo = [{"role": "user", "content": "w" * 400}]
    whole = RecordedUpstream([SAME])  # the read uninterrupted, in a service of its own
    expected = await decide(DecisionService(whole, n_probs=8, ubatch=63), convo, question)
    n = len(whole.requests[-1][1])
    keep = kept(n)
    up = CutUpstream([SAME] * 2)
    service = DecisionService(up, n_probs=8, ubatch=63)
    up.keep = keep
    with pytest.raises(UpstreamTimeout):
        await decide(service, convo, question)
    cut = len(up.requests)
    out = await decide(service, convo, question)
    retry = up.requests[cut:]
    # the read on what the slot kept; its last row went alone only when the rest made
    # whole pieces of 63, else it is read again alone, as the uninterrupted read ends
    keep = min(keep, n - 1)  # llama-server evaluates at least the last token
    assert retry[0][1:] == (whole.requests[-1][1], True, keep, n - keep)
    alone = (n - keep - 1) % 63 == 0
    assert len(retry) == (1 if alone else 2) and up.widths == [8] * len(retry)
    if not alone:
        assert retry[-1][1:] == whole.requests[-1][1:]
    assert sum(r[4] for r in retry) == n - keep + (0 if alone else 1)
    assert out.decision == expected.decision


async def test_an_admitted_decision_counts_its_evaluated_tokens_as_it_goes():
    """What a decision's reads evaluated tells admission how far it is: its second
    request (the last token alone, after a prompt past 256 tokens) sees the first's
    tokens done."""
    admission = Admission(max_active=4, max_queued=4, deadline_s=50, retry_after_s=1)

    seen: list[list[float]] = []

    class Watched(RecordedUpstream):
        async def complete(self, tokens, **kwargs):
            seen.append(admission.ahead())
            return await super().complete(tokens, **kwargs)

    up = Watched([{49: -1.0, 51: -2.0}])
    service = DecisionService(up, n_probs=8, admission=admission, ubatch=63)
    service.reader.cost.observe(CHUNK, 10, 0, upstream_s=0.01, wall_s=0.01)  # 1 ms a token
    await decide(service, [{"role": "user", "content": "t" * 400}], choice_question(["x", "y"]))
    (whole, last) = [evaluated for *_, evaluated in up.requests]
    assert last == 1 and whole > 256
    before, after = seen
    # all of it ahead before the first request; 1 token of whole + 1 left after it
    assert before == [pytest.approx((whole + 1) * 0.001)]
    assert after == [pytest.approx(before[0] / (whole + 1))]
    assert admission.ahead() == []


STATE = "a long shared state " * 20  # 400 tokens (one per character)


class _Admitted(Admission):
    """Admission that keeps the work of every request it is asked to admit."""

    def __init__(self):
        super().__init__(max_active=4, max_queued=4, deadline_s=50, retry_after_s=1)
        self.works = []

    def admit(self, work=None, deadline=None, facts=None):
        self.works.append(work)
        return super().admit(work, deadline, facts)


class _Overlapping(RecordedUpstream):
    async def render(self, messages, kwargs, facts=None):  # every turn, as a template would
        *earlier, _ = messages
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in earlier)
        return turns + await super().render(messages, kwargs)

    async def complete(self, tokens, **kwargs):
        await asyncio.sleep(0)  # as a real read, it lets the other questions lease
        return await super().complete(tokens, **kwargs)


def _estimated(fanout: int, reads: int, ubatch=0):
    """A service over two recorded slots whose admission keeps each request's estimate
    (the segment scheme, or the prefix scheme with ``ubatch``); 1 ms a token."""
    up = _Overlapping([{49: -1.0, 51: -2.0}] * reads)
    admission = _Admitted()
    service = DecisionService(
        up, n_probs=8, admission=admission, question_fanout=fanout, ubatch=ubatch
    )
    service.reader.cost.observe(CHUNK, 10, 0, upstream_s=0.01, wall_s=0.01)
    return service, up, admission.works


def _questions(letters: str):
    return {q: choice_question(["x", "y"], instructions=f"Question {q}?") for q in letters}


@pytest.mark.parametrize(
    ("fanout", "fresh_reads"),
    [(1, 1), (0, 2), (3, 2)],
)
async def test_the_estimate_counts_the_state_again_in_each_slot_a_fan_out_spreads_to(
    fanout, fresh_reads
):
    """On the segment scheme a request's questions after the first are read in turn in
    the slot the first left (``--question-fanout 1``), or at once, each in a slot of its
    own (two slots here), where all but the
    first's evaluate the state again: admission's estimate counts exactly the tokens the
    reads evaluate."""
    service, up, admitted = _estimated(fanout, 3)
    await service.answer(Asked([{"role": "user", "content": STATE}], _questions("ABC")), Facts())
    (work,) = admitted
    reads = [r for r in up.requests if r[4] > 0]
    assert len({slot for slot, *_ in reads}) == fresh_reads
    whole = max(evaluated for *_, evaluated in reads)  # the first read, from nothing
    assert sum(evaluated for *_, evaluated in reads if evaluated == whole) == fresh_reads * whole
    assert work.tokens == sum(evaluated for *_, evaluated in up.requests)


async def test_a_fan_out_to_slots_that_already_hold_the_state_is_estimated_without_it():
    """The same state asked about again: both slots hold it from the first fan-out, so
    the second evaluates only its questions, and its estimate says so."""
    service, up, admitted = _estimated(0, 6)
    for batch in ("ABC", "DEF"):
        cut = len(up.requests)
        await service.answer(
            Asked([{"role": "user", "content": STATE}], _questions(batch)), Facts()
        )
        evaluated = [r[4] for r in up.requests[cut:]]
        assert admitted[-1].tokens == sum(evaluated)
    # the second batch's reads evaluate their questions only: each less than the state
    assert max(evaluated) < len(STATE)
    assert len({r[0] for r in up.requests}) == 2


class _ByPrompt(_Overlapping):
    """Log-probabilities that depend on the prompt alone, as a model's do: a read gives
    the same numbers whichever slot or order it comes in."""

    async def complete(self, tokens, **kwargs):
        done = await super().complete(tokens, **kwargs)
        if kwargs.get("n_probs"):
            h = zlib.crc32(bytes(t % 256 for t in tokens))
            top = {49 + i: -((h >> (4 * i)) % 16) / 4 - 0.1 for i in range(8)}
            done = replace(done, read=replace(done.read, logprobs=top))
        return done


@pytest.mark.parametrize("shape", ["user", "system"])
async def test_a_contextual_fan_out_answers_as_questions_read_one_after_another(shape):
    """Fanned out over the slots on the segment scheme, each question is still divided by
    its own content-free answer, read once: the same probabilities, reads and tokens in as
    with the questions read one after another."""
    answers = []
    for fanout in (1, 0):
        up = _ByPrompt([{}] * 40)
        service = DecisionService(up, n_probs=8, question_fanout=fanout)
        asked = Asked(_about(STATE, shape), _questions("ABC"), debias_method="contextual")
        answered = await service.answer(asked, Facts())
        answers.append(
            {
                qid: (o.decision.probabilities, o.reads, o.tokens_in, o.debias)
                for qid, o in answered.items()
            }
        )
        assert len(up.widths) == 6  # each question's read and its content-free one
    one_by_one, fanned_out = answers
    assert fanned_out == one_by_one
    assert {reads for _, reads, _, _ in fanned_out.values()} == {2}
    assert len({p for p, *_ in fanned_out.values()}) == 3  # the questions differ


@pytest.mark.parametrize("method", ["cyclic", "contextual"])
async def test_a_score_asked_with_debiasing_is_read_and_estimated_once(method):
    """Scores are neither rotated nor divided by a content-free answer: one read, and
    the estimate counts that read alone."""
    service, up, admitted = _estimated(1, 2)
    question = score_question(["low", "high"], instructions="How urgent?")
    outcome = await decide(
        service,
        _about(STATE, "user"),
        question,
        debias=(0, 1) if method == "cyclic" else (),
        contextual=method == "contextual",
    )
    assert outcome.reads == 1 and len(up.widths) == 1
    cut = len(up.requests)
    await service.answer(
        Asked(_about(STATE.upper(), "user"), {"s": question}, debias_method=method), Facts()
    )
    assert admitted[-1].tokens == sum(r[4] for r in up.requests[cut:]) > len(STATE)
    assert len(up.widths) == 2


def _about(state: str, shape: str) -> list[dict]:
    if shape == "system":  # the state as a system turn: the content-free turn shares it
        return [{"role": "system", "content": state}, {"role": "user", "content": "Hello?"}]
    return [{"role": "user", "content": state}]


@pytest.mark.parametrize(
    ("method", "fanout", "ubatch", "shape"),
    [
        ("cyclic", 1, 0, "user"),
        ("cyclic", 0, 0, "user"),
        ("cyclic", 1, 63, "user"),
        ("contextual", 1, 0, "user"),
        ("contextual", 1, 63, "user"),
        ("contextual", 1, 0, "system"),
        ("contextual", 1, 63, "system"),
    ],
)
async def test_debiasing_reads_are_estimated_as_they_evaluate(method, fanout, ubatch, shape):
    """Each cyclic rotation after a question's first read evaluates from the question on,
    the state staying in the slot, also when that first read began in an empty slot; a
    content-free answer not yet remembered is one read more, in a slot of its own or (a
    content-free turn that shares the state, on the prefix scheme) in the decision's. The
    estimate makes each of those prompts and counts exactly the tokens the reads
    evaluate, on either scheme; the next request, whose content-free answers are
    remembered, is costed without them."""
    service, up, admitted = _estimated(fanout, 12, ubatch=ubatch)
    for state in (STATE, STATE.upper()):
        cut = len(up.requests)
        asked = Asked(_about(state, shape), _questions("ABC"), debias_method=method)
        await service.answer(asked, Facts())
        evaluated = [r[4] for r in up.requests[cut:]]
        assert admitted[-1].tokens == sum(evaluated)
    # 3 content-free answers in all, unless each request's differs (the state in it)
    assert len(up.widths) == (9 if method == "contextual" and shape == "user" else 12)
    # the rotations and content-free reads evaluate no state again: only a question's
    # first read in each slot does (two at once with the fan-out, in slots of their own;
    # on the segment scheme the content-free turn after a shared state has a segment of
    # its own, read in another slot; on the prefix scheme it stays in the decision's)
    aside = fanout == 0 or (shape == "system" and not ubatch)
    assert sum(e >= len(STATE) for e in evaluated) == (2 if aside else 1)


async def test_the_width_that_held_the_labels_is_where_the_next_decision_starts():
    # labels with little mass (a model that wants a preamble first): the first decision
    # widens twice; the next on the same labels reads once, at the width that held them
    narrow = {49: -9.0, 7: -0.01}
    wide = {49: -9.0, 7: -0.01, 51: -11.0}
    up = RecordedUpstream([narrow, narrow, wide, wide, {49: -1.0, 51: -1.0, 52: -1.0}])
    service = DecisionService(up, n_probs=8)
    question = choice_question(["x", "y"])
    first = await decide(service, [{"role": "user", "content": "q"}], question)
    assert (up.widths, first.reads) == ([8, 1024, 49152], 3)
    second = await decide(service, [{"role": "user", "content": "r"}], question)
    assert (up.widths[3:], second.reads) == ([49152], 1)
    assert second.decision.probabilities == pytest.approx(
        (1 / (1 + math.exp(-2.0)), 1 / (1 + math.exp(2.0))), rel=1e-12
    )
    other = choice_question(["x", "y", "z"])  # other labels: from the first width
    assert (await decide(service, [{"role": "user", "content": "s"}], other)).reads == 1
    assert up.widths[4:] == [12]


async def test_a_kept_verdict_reads_nothing_but_the_opening_into_one_slot(no_pause):
    from proxy.verdicts import Verdicts

    kept = Verdicts(None)
    first = DecisionService(RecordedUpstream([SAME] * 6), n_probs=8, ubatch=63, verdicts=kept)
    await first.self_check.run()
    assert first.self_check.result.repeatable is True
    # llama-server came back (or the proxy started again with the file): the same key
    up = RecordedUpstream([{49: -1.0}])  # the one read the opening needs
    again = DecisionService(up, n_probs=8, ubatch=63, verdicts=kept)
    await again.self_check.run()
    assert (
        again.self_check.result.repeatable is True
        and "(kept from the check at " in again.self_check.result.detail
    )
    [(_, sent, cache, _, _)] = up.requests  # one request: the opening, into one slot
    assert cache and "".join(map(chr, sent)) == "<|im_start|>user\n"  # what prompts share


async def test_another_model_is_checked_anew_though_a_verdict_is_kept(no_pause):
    from proxy.verdicts import Verdicts

    kept = Verdicts(None)
    await DecisionService(
        RecordedUpstream([SAME] * 6), n_probs=8, ubatch=63, verdicts=kept
    ).self_check.run()
    up = RecordedUpstream([SAME] * 6)
    up.model = "another"  # identity() names it: another key
    service = DecisionService(up, n_probs=8, ubatch=63, verdicts=kept)
    await service.self_check.run()
    assert (
        service.self_check.result.repeatable is True
        and "kept" not in service.self_check.result.detail
    )
    assert len([r for r in up.requests if r]) >= 6


async def test_a_self_check_past_its_bound_leaves_the_proxy_unchecked(monkeypatch, caplog):
    monkeypatch.setattr("proxy.checking.CHECK_BOUND_S", 0.05)
    up = RecordedUpstream([SAME] * 6)
    original = up.complete

    async def slow(*args, **kwargs):
        await asyncio.sleep(0.02)
        return await original(*args, **kwargs)

    up.complete = slow
    service = DecisionService(up, n_probs=8, ubatch=63)
    await service.self_check.run()
    assert service.self_check.result.repeatable is None
    assert service.self_check.result.detail == "not checked: over 0 s"
    assert "took more than 0s" in caplog.text


async def test_a_check_cut_short_by_llama_server_going_away_is_made_again(no_pause):
    from proxy.errors import UpstreamUnavailable

    up = RecordedUpstream([SAME] * 6)
    real = up.identity
    calls = []

    async def away_once():
        calls.append(1)
        if len(calls) == 1:
            raise UpstreamUnavailable("llama-server is not ready: Loading model")
        return await real()

    up.identity = away_once
    service = DecisionService(up, n_probs=8, ubatch=63, self_check=True)
    assert await service.self_check.settled() is False  # the first count starts it
    await asyncio.wait_for(service.self_check._task, 5)
    assert service.self_check.result.detail.startswith("not checked: llama-server is not ready")
    assert await service.self_check.settled() is False  # due again: started once more
    await asyncio.wait_for(service.self_check._task, 5)
    assert (
        await service.self_check.settled() is True and service.self_check.result.repeatable is True
    )


async def test_a_remembered_width_is_tried_narrow_again_after_a_while(monkeypatch):
    monkeypatch.setattr("proxy.reading._NARROW_AGAIN", 2)
    narrow, wide = {49: -9.0, 7: -0.01}, {49: -9.0, 7: -0.01, 51: -11.0}
    up = RecordedUpstream([narrow, narrow, wide, wide, narrow, narrow, wide])
    service = DecisionService(up, n_probs=8)
    question = choice_question(["x", "y"])
    reads = [
        (await decide(service, [{"role": "user", "content": c}], question)).reads for c in "qrs"
    ]
    # kept for two decisions (the one that widened and the next), then narrow again
    assert reads == [3, 1, 3]
    assert up.widths == [8, 1024, 49152, 49152, 8, 1024, 49152]


async def test_a_kept_verdict_brings_the_costs_its_check_taught(no_pause):
    from proxy.verdicts import Verdicts

    kept = Verdicts(None)
    first = DecisionService(RecordedUpstream([SAME] * 6), n_probs=8, ubatch=63, verdicts=kept)
    first.reader.cost.observe(CHUNK, 40, 0, 0.5, 0.52)  # as the check's timed reads teach
    await first.self_check.run()
    again = DecisionService(RecordedUpstream([{49: -1.0}]), n_probs=8, ubatch=63, verdicts=kept)
    await again.self_check.run()
    # the prime taught nothing; the kept costs are a prior (proxy/cost.py): the same fit,
    # no step of this run's own yet
    assert again.reader.cost.observed == 0
    for kind in (CHUNK, ONE):
        mine, theirs = again.reader.cost.steps[kind], first.reader.cost.steps[kind]
        assert (mine.a, mine.b) == (pytest.approx(theirs.a), pytest.approx(theirs.b))
