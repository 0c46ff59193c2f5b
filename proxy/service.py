"""The decision service: one question in, one exact ``Decision`` out.

For each request it (1) assigns labels that are verified single tokens at the
answer position of the served model's chat template, (2) appends the options
block to the conversation, (3) reads the next token's log-probabilities with a
grammar that allows only the labels, and (4) widens the read (same prompt,
served from llama-server's prompt cache) until every label's log-probability
is known. Nothing is guessed: a label missing from the widest read is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import orjson

from .decision.debias import average, divide_out, rotate
from .decision.labels import (
    CANDIDATES,
    LabelError,
    assign_labels,
    gbnf_alternatives,
    single_token_id,
)
from .decision.prompt import (
    ANSWER_INSTRUCTION,
    CONTENT_FREE,
    answer_context,
    DEFAULT_LAYOUT,
    append_to_conversation,
    lay_out,
    content_free,
    options_block,
    state_messages,
)
from .decision.question import Question, choice_question
from .decision.selfcheck import CHECK_OPTIONS, CHECK_TEXT, OTHER_TEXT, Check, compare
from .decision.outcome import Outcome
from .decision.readout import decide
from .admission import Admission, Work
from .cost import ONE, CostModel, kind_of
from .errors import InvalidRequest, UpstreamBadResponse
from .kv import (LONE_ROW_CELLS, MAX_SMALL_CHUNK, Held, SlotBook, Step, after, common_prefix,
                 lone_last, plan, plan_prefix)
from .metrics import Metrics, after_reply
from .upstream import Completion, ModelInfo, NextToken, Upstream

__all__ = ["DecisionService", "Outcome", "read_widths"]

_WIDE_READ = 1024
_UNKNOWN_VOCAB = 1 << 18  # llama-server clamps n_probs to its vocabulary
_TOKENIZE_BATCH = 32
_MAX_TEMPLATES = 32  # distinct chat_template_kwargs remembered
_MAX_KWARGS_CHARS = 4096
_MAX_LAYOUTS = 512  # distinct (options, labels) layouts remembered ...
_MAX_LAYOUT_CHARS = 8192  # ... each at most this long: at most ~10 MB in all
_NO_THINKING: Mapping[str, Any] = MappingProxyType({"enable_thinking": False})  # the default
_MAX_PROMPTS = 256  # rendered and tokenised prompts remembered ...
_MAX_PROMPT_KEY = 64 * 1024  # ... for conversations up to this size (JSON bytes)
_MAX_SEGMENTS = 64  # shared segments (states, conversations) tokenised, remembered
_MAX_CONTENT_FREE = 256  # content-free answers (contextual calibration) remembered
_LEAST_WEIGHT = 1e-300  # a content-free probability that underflowed still divides
log = logging.getLogger("proxy")
_NO_THINKING_KEY = orjson.dumps(dict(_NO_THINKING), option=orjson.OPT_SORT_KEYS).decode()


def read_widths(first: int, n_labels: int, n_vocab: int | None) -> list[int]:
    """The top-k sizes tried in turn: the configured first read (at least 4 per
    label), a wide read, then the whole vocabulary. Strictly increasing."""
    vocab = n_vocab or _UNKNOWN_VOCAB
    steps = [max(first, 4 * n_labels), max(_WIDE_READ, 16 * n_labels), vocab]
    out: list[int] = []
    for k in steps:
        k = min(k, vocab)
        if not out or k > out[-1]:
            out.append(k)
    return out


class DecisionService:
    def __init__(
        self, upstream: Upstream, *, n_probs: int, question_fanout: int = 1,
        metrics: Metrics | None = None, admission: Admission | None = None,
        worker: tuple[int, int] = (0, 1), ubatch: int = 0, self_check: bool = False,
    ):
        self._upstream = upstream
        # llama-server's physical batch, when known and small enough for the prefix
        # scheme (proxy/kv.py); 0: the segment scheme
        self._ubatch = ubatch if 2 <= ubatch <= MAX_SMALL_CHUNK else 0
        self._check = Check(self.scheme, None)
        self._checking: asyncio.Task | None = None
        self._self_check = self_check  # run check() when the slots are first counted
        self._epoch = getattr(upstream, "epoch", 0)  # a stand-in upstream may have none
        self._worker = worker
        self._admission = admission or Admission(
            max_active=1 << 30, max_queued=0, deadline_s=3600.0, retry_after_s=1
        )
        self._metrics = metrics
        self._n_probs = n_probs
        self._fanout = question_fanout
        self._lock = asyncio.Lock()
        self._info: ModelInfo | None = None
        self._slots: int | None = None
        self._contexts: dict[str, str] = {}  # template kwargs (JSON) -> answer context
        self._token_ids: dict[str, dict[str, int | None]] = {}  # context -> label -> id
        # (template kwargs, option count) -> the model and the labels assigned for it:
        # the lock-free fast path, used only while that model is still the one served
        self._assigned: dict[tuple[str, int], tuple[ModelInfo, tuple[tuple[str, int], ...]]] = {}
        self._layouts: dict[tuple[Any, ...], tuple[str, str]] = {}  # see _layout
        self._slot_book: SlotBook | None = None  # llama-server's slots, once counted
        self._prompts: dict[bytes, tuple[tuple[int, ...], int]] = {}  # see _prompt
        self._segments: dict[str, tuple[int, ...]] = {}  # shared segment text -> tokens
        self._content_free: dict[bytes, tuple[float, ...]] = {}  # see _free_answer
        self._reranks: bool | None = None  # a --reranking llama-server: see reranks
        self.cost = CostModel()  # what a step costs on this llama-server (proxy/cost.py)
        self._steps_running = self._steps_started = 0  # this service's /completion calls
        self._reads_needed: dict[int, int] = {}  # option count -> reads its last decision took

    async def decide(
        self, messages: Sequence[Mapping[str, Any]], question: Question,
        template_kwargs: Mapping[str, Any] | None = None, *, debias: Sequence[int] = (),
        contextual: bool = False, layout: str = DEFAULT_LAYOUT,
    ) -> Outcome:
        """One question asked about a conversation, in ``layout`` (decision/prompt.py).
        ``debias``: the cyclic shifts of the options to read and average (empty: one read
        as given); ``contextual``: divide out the answer to the same question about a
        content-free last user turn (decision/debias.py)."""
        if self._metrics:
            after_reply(self._metrics.questions.observe, 1)
        free = content_free(messages) if contextual else None
        work = await self._work([(messages, question)], template_kwargs, layout,
                                len(debias) or 1, free is not None)
        async with self._admission.admit(work):
            return await self._decide(messages, question, template_kwargs, debias, free,
                                      layout)

    async def _decide(
        self, messages: Sequence[Mapping[str, Any]], question: Question,
        template_kwargs: Mapping[str, Any] | None, debias: Sequence[int],
        free: Sequence[Mapping[str, Any]] | None = None, layout: str = DEFAULT_LAYOUT,
    ) -> Outcome:
        if list(debias) in ([], [0]) or question.kind == "score":
            outcome = await self._decide_once(messages, question, template_kwargs, layout)
        else:
            # one after another: each rotation reuses the KV of everything before the options
            reads = [(s, await self._decide_once(messages, rotate(question, s), template_kwargs,
                                                 layout))
                     for s in debias]
            first = reads[0][1]
            outcome = Outcome(
                average(question, [(s, o.decision) for s, o in reads]),
                first.labels,  # the first shift is 0: the options in the caller's order
                first.model, first.prompt_tokens,
                sum(o.prompt_evaluated for _, o in reads), sum(o.reads for _, o in reads),
                debias="cyclic", input_tokens=sum(o.tokens_in for _, o in reads),
                rotations=tuple((s, o.decision.probabilities) for s, o in reads),
                read_scheme=first.read_scheme, repeatable=first.repeatable, layout=layout,
            )
        if free is not None and question.kind != "score":
            weights, spent = await self._free_answer(free, question, template_kwargs, layout)
            outcome = replace(outcome, decision=divide_out(outcome.decision, weights),
                              reads=outcome.reads + (spent.reads if spent else 0),
                              prompt_evaluated=outcome.prompt_evaluated + (
                                  spent.prompt_evaluated if spent else 0),
                              input_tokens=outcome.tokens_in + (spent.tokens_in if spent else 0),
                              debias="contextual")
        if self._metrics:
            after_reply(self._metrics.decision, outcome.decision, outcome.reads)
        return outcome

    async def _free_answer(
        self, free: Sequence[Mapping[str, Any]], question: Question,
        template_kwargs: Mapping[str, Any] | None, layout: str,
    ) -> tuple[tuple[float, ...], Outcome | None]:
        """The probabilities the model gives the question's options about a content-free
        input, and the read that took them (None when remembered): read once per question
        template, then remembered."""
        key = orjson.dumps([free, question.kind, question.names, question.shown,
                            question.instructions, question.temperature,
                            dict(template_kwargs or {}), layout], option=orjson.OPT_SORT_KEYS)
        known = self._content_free.get(key)
        if known is not None:
            return known, None
        read = await self._decide_once(free, question, template_kwargs, layout)
        weights = tuple(max(p, _LEAST_WEIGHT) for p in read.decision.probabilities)
        if len(key) <= _MAX_PROMPT_KEY:
            _remember(self._content_free, key, weights, _MAX_CONTENT_FREE)
        return weights, read

    async def _decide_once(
        self, messages: Sequence[Mapping[str, Any]], question: Question,
        template_kwargs: Mapping[str, Any] | None, layout: str = DEFAULT_LAYOUT,
    ) -> Outcome:
        kwargs = {"enable_thinking": False, **template_kwargs} if template_kwargs else _NO_THINKING
        for _attempt in range(2):
            info, labels = await self._labels(len(question.names), kwargs)
            outcome = await self._read(messages, question, labels, kwargs, info, layout)
            if outcome is not None:
                return outcome
            self._forget()  # another model answered: verify labels again, once
        raise UpstreamBadResponse("llama-server changed models while answering")

    async def decide_many(
        self, state_text: str, questions: Mapping[str, Question],
        *, debias: Mapping[str, Sequence[int]] | None = None,
        contextual: frozenset[str] = frozenset(),
    ) -> dict[str, Outcome]:
        """Answer every question about one state, each in its own prompt (state
        first, question last), so no answer depends on the other questions.

        The first question is read alone: it computes the state's KV in one slot.
        The rest follow ``question_fanout`` at a time (0: one per llama-server
        slot). One at a time, each lands in the slot that holds the state and
        computes only its own question; in parallel, every other slot computes
        the state once more, which costs more than it saves on a CPU
        (bench/shared_state.py) but is nearly free on a GPU. The questions in
        ``contextual`` are calibrated against the same question about the state "N/A".
        """
        if self._metrics:
            after_reply(self._metrics.questions.observe, len(questions))
        messages = state_messages(state_text)
        work = await self._work([(messages, q) for q in questions.values()], None,
                                DEFAULT_LAYOUT, max((len(d) for d in (debias or {}).values()),
                                                   default=1) or 1, bool(contextual))
        async with self._admission.admit(work):
            return await self._decide_all(state_text, questions, debias or {}, contextual)

    async def _decide_all(
        self, state_text: str, questions: Mapping[str, Question],
        debias: Mapping[str, Sequence[int]], contextual: frozenset[str],
    ) -> dict[str, Outcome]:
        items = list(questions.items())
        messages = state_messages(state_text)
        free = state_messages(CONTENT_FREE)

        def against(qid: str) -> list[dict[str, Any]] | None:
            return free if qid in contextual else None

        first_id, first = items[0]
        outcomes = {first_id: await self._decide(messages, first, None,
                                                 debias.get(first_id, ()), against(first_id))}
        if len(items) > 1:
            limit = asyncio.Semaphore(self._fanout or await self.total_slots())

            async def one(qid: str, question: Question) -> None:
                async with limit:
                    outcomes[qid] = await self._decide(
                        messages, question, None, debias.get(qid, ()), against(qid)
                    )

            try:
                async with asyncio.TaskGroup() as group:
                    for qid, question in items[1:]:
                        group.create_task(one(qid, question))
            except ExceptionGroup as failed:  # the first failure speaks for the request
                raise failed.exceptions[0] from None
        return {qid: outcomes[qid] for qid, _ in items}

    async def model(self) -> ModelInfo:
        """What llama-server serves (cached; refreshed when another model answers)."""
        if self._info is None:
            self._info = await self._upstream.model_info()
        return self._info

    async def reranks(self) -> bool:
        """Whether llama-server serves a reranker model, which answers rerank requests
        itself (asked once)."""
        if self._reranks is None:
            found = await self._upstream.reranks()
            if found is None:  # neither answer: read here this time, ask again next time
                return False
            self._reranks = found
        return self._reranks

    @property
    def upstream_model(self) -> str | None:
        """The model a llama-server router routes this service's reads to (None: one
        model, nothing named)."""
        return self._upstream.model

    async def total_slots(self) -> int:
        """llama-server's parallel slots (asked once)."""
        if self._slots is None:
            self._slots = await self._upstream.total_slots() or 1
        return self._slots

    # -- what a decision costs (proxy/cost.py), for admission -----------------------

    async def _work(self, asked: Sequence[tuple[Sequence[Mapping[str, Any]], Question]],
                    template_kwargs: Mapping[str, Any] | None, layout: str, rotations: int,
                    contextual: bool) -> Work | None:
        """The tokens and idle-server seconds of reading each (conversation, question) in
        turn, the first on the slot holding most of its prompt and each next on the slot
        the one before left (as the slot book places a conversation's questions); each
        read widened as often as the last one with as many options; ``rotations`` reads
        per question (debiasing: each again from the options on), one more for a
        content-free answer. None while this server's costs are unknown or the prompt
        cannot be planned (images; a template that hides the options)."""
        if self.cost.observed == 0:
            return None
        kwargs = {"enable_thinking": False, **template_kwargs} if template_kwargs else _NO_THINKING
        ubatch = self._ubatch
        book = await self._book()
        before: Held | None = None
        tokens = 0
        seconds = 0.0
        for messages, question in asked:
            info, labels = await self._labels(len(question.names), kwargs)
            block, _grammar = self._layout(question, tuple(label for label, _ in labels))
            convo = lay_out(messages, block, layout)
            found = await self._prompt(convo, block, kwargs, ubatch) if _text_only(convo) else None
            if found is None or (info.n_ctx and len(found[0]) >= info.n_ctx):
                return None  # read as it comes, or refused by the read for its length
            prompt, s_len = found
            if before is None:  # the slot that holds most of this prompt
                before = max(book.holds.values(), default=None,
                             key=lambda h: -1 if h is None else common_prefix(h.tokens, prompt))
                if not ubatch and (before is None or before.s_len != s_len):
                    before = None
            steps = (plan_prefix(before, prompt, ubatch) if ubatch
                     else plan(before, s_len, prompt))
            for step in steps:
                cost = self.cost.step_s(kind_of(step.evaluated, ubatch), step.evaluated,
                                        step.cached)
                if cost is None:
                    return None
                tokens += step.evaluated
                seconds += cost
            again = rotations - 1 + int(contextual)  # the options again, from where they start
            if again:
                part = steps[-1].length - common_prefix(prompt, before.tokens if before else ())
                part = min(max(part, 1), len(prompt) - 1)
                cost = self.cost.step_s(kind_of(part, ubatch), part, len(prompt) - part) or 0.0
                tokens += again * part
                seconds += again * cost
            widen = self._reads_needed.get(len(question.names), 1) * (rotations + contextual)
            one = self.cost.step_s(ONE, 1, len(prompt)) or 0.0
            seconds += (widen - rotations - int(contextual)) * one
            before = Held(prompt, s_len)
        return Work(tokens, seconds)

    async def _resume(self, book: SlotBook, slot: int, held: Held, prompt: tuple[int, ...],
                      width: int, grammar: str, ubatch: int) -> tuple[NextToken | None, int]:
        """After a read cut short in ``slot``: read after ``prompt`` on whatever the slot
        kept, and record what it then holds. The read when its last row went alone (or the
        prompt fits the first 256 cells), as the canonical plan's does, else None; and the
        tokens evaluated."""
        try:
            done = await self._complete(prompt, slot=slot, cache=True, n_probs=width,
                                        grammar=grammar)
        except BaseException:
            book.holds[slot] = Held(prompt, 0, lone_last(Step(len(prompt), True, 0, 1),
                                                         ubatch), partial=True)
            raise
        n = len(prompt)
        got = Step(n, True, done.cached, done.read.prompt_evaluated)
        if got.cached > common_prefix(held.tokens, prompt) or got.cached + got.evaluated != n:
            book.holds[slot] = None  # more than was left there: someone else's rows
            return None, got.evaluated
        book.holds[slot] = Held(prompt, 0, lone_last(got, ubatch))
        alone = n <= LONE_ROW_CELLS or book.holds[slot].lone_last
        return (done.read if alone else None), got.evaluated

    async def _complete(self, tokens: Sequence[int], *, slot: int, cache: bool,
                        n_probs: int = 0, grammar: str | None = None) -> Completion:
        """``Upstream.complete``, timed: a step no other step of this service ran beside
        teaches the cost model what such a step costs."""
        alone = self._steps_running == 0
        self._steps_running += 1
        self._steps_started += 1
        mark = self._steps_started
        started = time.monotonic()
        try:
            done = await self._upstream.complete(tokens, slot=slot, cache=cache,
                                                 n_probs=n_probs, grammar=grammar)
        finally:
            self._steps_running -= 1
        if alone and mark == self._steps_started and done.seconds > 0:
            evaluated = done.read.prompt_evaluated
            self.cost.observe(kind_of(evaluated, self._ubatch), evaluated, done.cached,
                              done.seconds, time.monotonic() - started)
        return done

    async def _read(
        self, messages: Sequence[Mapping[str, Any]], question: Question,
        labels: Sequence[tuple[str, int]], kwargs: Mapping[str, Any], info: ModelInfo,
        layout: str = DEFAULT_LAYOUT,
    ) -> Outcome | None:
        """The read, or ``None`` when a model other than ``info``'s answered it.

        Text conversations are read repeatably (``proxy/kv.py``): through ``/completion``
        with the prompt's tokens, pinned to a leased slot. Others (images, audio) go
        through llama-server's chat endpoint, which renders them itself."""
        names = tuple(label for label, _ in labels)
        block, grammar = self._layout(question, names)
        convo = lay_out(messages, block, layout)
        ids = [tid for _, tid in labels]
        ubatch = self._ubatch  # this read's scheme, even if a self-check changes it meanwhile
        tokens = await self._prompt(convo, block, kwargs, ubatch) if _text_only(convo) else None
        if tokens is not None and info.n_ctx and len(tokens[0]) >= info.n_ctx:
            raise InvalidRequest(
                f"the prompt needs {len(tokens[0]) + 1} tokens (the answer's included); a "
                f"llama-server slot holds {info.n_ctx}: send less, or start llama-server with "
                "a larger context per slot", code="context_length_exceeded")
        evaluated = reads = 0
        first: NextToken | None = None
        book = await self._book()
        segment = (tokens[0] if ubatch else tokens[0][:tokens[1]]) if tokens else ()
        async with book.lease(segment, by_prefix=bool(ubatch)) as slot:
            for width in read_widths(self._n_probs, len(labels), info.n_vocab):
                if tokens is None:  # pinned too, so that it cannot land in a leased slot
                    book.holds[slot] = None
                    read = await self._upstream.next_token(
                        convo, labels_grammar=grammar, n_probs=width, template_kwargs=kwargs,
                        slot=slot)
                    spent = read.prompt_evaluated
                else:
                    read, spent = await self._repeatable(book, slot, *tokens, width, grammar,
                                                         ubatch)
                if read.model != info.id:
                    return None
                first = first or read
                reads += 1
                evaluated += spent
                # All labels from one read: one forward pass, one set of numerics.
                logprobs = read.of(ids)
                if logprobs is not None:
                    _remember(self._reads_needed, len(labels), reads, _MAX_TEMPLATES)
                    return Outcome(  # each read sent the whole prompt (mostly cached)
                        decide(question, logprobs), tuple(names), read.model,
                        first.prompt_tokens, evaluated, reads,
                        input_tokens=first.prompt_tokens * reads,
                        read_scheme=self.scheme if tokens is not None else "chat",
                        repeatable=self._check.repeatable if tokens is not None else False,
                        layout=layout,
                    )
        missing = [label for label, tid in labels if tid not in read.logprobs]
        raise UpstreamBadResponse(
            f"llama-server returned no log-probability for labels {missing} "
            "even over the whole vocabulary"
        )

    async def _repeatable(self, book: SlotBook, slot: int, prompt: tuple[int, ...], s_len: int,
                          width: int, grammar: str, ubatch: int) -> tuple[NextToken, int]:
        """Read the next token after ``prompt`` evaluated the canonical way (``kv.plan``),
        and the tokens evaluated for it. A slot found changed under the read (llama-server
        reused other than expected) starts it again from a cold shared segment; if that
        happens twice, the read is made as it comes and counted as unrepeatable.

        The prefix scheme keeps the work of a read cut short (a deadline, a client gone):
        the slot holds some prefix of what was sent, each row canonical, so the next read
        there reads on whatever llama-server reuses of it (``_resume``), and reads the last
        token again alone when it did not go alone the first time."""
        spent = restarts = 0
        held = book.holds[slot]
        if ubatch and held is not None and held.partial:
            read, spent = await self._resume(book, slot, held, prompt, width, grammar, ubatch)
            if read is not None:
                return read, spent
        while restarts < 2:
            steps = (plan_prefix(book.holds[slot], prompt, ubatch) if ubatch
                     else plan(book.holds[slot], s_len, prompt))
            for step in steps:
                sent = after(step, prompt)
                last = step is steps[-1]
                try:
                    done = await self._complete(
                        sent, slot=slot, cache=step.cache, n_probs=width if last else 0,
                        grammar=grammar if last else None)
                except BaseException:
                    if ubatch:  # what was evaluated stays for a retry (kv.Held.partial)
                        book.holds[slot] = Held(sent, 0, lone_last(step, ubatch), partial=True)
                    raise
                spent += done.read.prompt_evaluated
                if (done.cached, done.read.prompt_evaluated) != (step.cached, step.evaluated):
                    book.holds[slot] = None
                    restarts += 1
                    break
                book.holds[slot] = Held(sent, s_len, ubatch > 0 and lone_last(step, ubatch))
            else:
                return done.read, spent
        done = await self._complete(prompt, slot=slot, cache=True, n_probs=width,
                                    grammar=grammar)
        book.holds[slot] = None
        log.warning("llama-server slot %d kept changing under a read (reused %d of %d "
                    "tokens): this answer may differ from a replay", slot, done.cached,
                    len(prompt))
        if self._metrics:
            self._metrics.unrepeatable_reads.inc()
        return done.read, spent + done.read.prompt_evaluated

    async def _prompt(self, convo: list[dict[str, Any]], block: str,
                      kwargs: Mapping[str, Any], ubatch: int
                      ) -> tuple[tuple[int, ...], int] | None:
        """The prompt's tokens (as llama-server's chat endpoint would make them) and the
        length of its shared segment: the tokens it has in common with the text before
        the options block tokenised alone (whitespace before the block may tokenise
        differently in context); with the prefix scheme (``ubatch``), 0. Remembered;
        ``None`` when the template hides the block."""
        key = orjson.dumps([convo, dict(kwargs), ubatch], option=orjson.OPT_SORT_KEYS)
        known = self._prompts.get(key)
        if known is not None:
            return known
        rendered = await self._upstream.render(convo, kwargs)
        at = rendered.rfind(block)
        if at <= 0:
            return None
        if ubatch:  # the prefix scheme: no segment, one /tokenize
            tokens = tuple(await self._upstream.tokenize(rendered, special=True))
            if len(tokens) < 2:
                return None
            found = (tokens, 0)
            if len(key) <= _MAX_PROMPT_KEY:
                _remember(self._prompts, key, found, _MAX_PROMPTS)
            return found
        segment = self._segments.get(rendered[:at])
        if segment is None:
            segment = tuple(await self._upstream.tokenize(rendered[:at], special=True))
            if at <= _MAX_PROMPT_KEY:  # callers choose the text: bounded
                _remember(self._segments, rendered[:at], segment, _MAX_SEGMENTS)
        tokens = tuple(await self._upstream.tokenize(rendered, special=True))
        shared = common_prefix(segment, tokens)
        if not 0 < shared < len(tokens):
            return None
        found = (tokens, shared)
        if len(key) <= _MAX_PROMPT_KEY:
            _remember(self._prompts, key, found, _MAX_PROMPTS)
        return found

    async def _book(self) -> SlotBook:
        if self._slot_book is None:
            total = await self.total_slots()
            if self._slot_book is None:  # the first to get here after the await makes it
                self._slot_book = SlotBook(worker_slots(total, *self._worker))
                self._admission.limit_parallel(self._slot_book.size, self)
                self._start_check()
        epoch = getattr(self._upstream, "epoch", 0)
        if epoch != self._epoch:  # llama-server came back: its slots and kernels are new
            self._epoch = epoch
            self._slot_book.forget()
            self._start_check()
        return self._slot_book

    # -- the self-check (decision/selfcheck.py) ----------------------------------

    @property
    def scheme(self) -> str:
        """How prompts are evaluated (proxy/kv.py): ``prefix-<ub>`` or ``segment``."""
        return f"prefix-{self._ubatch}" if self._ubatch else "segment"

    @property
    def checked(self) -> Check:
        """The latest self-check (``repeatable`` None while none has finished)."""
        return self._check

    def _start_check(self) -> None:
        if not self._self_check:
            return
        if self._checking is None or self._checking.done():
            self._check = Check(self.scheme, None)
            self._checking = asyncio.get_running_loop().create_task(self._check_in_turn())

    async def _check_in_turn(self) -> None:
        try:
            check = await self.check()
            if check.repeatable is False and self._ubatch:
                log.warning("repeatable reads failed the self-check with the prefix scheme "
                            "(%s); falling back to the segment scheme", check.detail)
                self._ubatch = 0
                self._slot_book.forget()
                self._prompts.clear()  # remembered without their shared segment's length
                check = await self.check()
            self._check = check
        except Exception as exc:  # noqa: BLE001 - a check that cannot run decides nothing
            log.warning("the repeatability self-check could not run: %s", exc)
            self._check = Check(self.scheme, None, f"not checked: {exc}")
            return
        if self._check.repeatable is False:
            log.warning("repeatable reads failed the self-check (%s): answers say "
                        "repeatable: false", self._check.detail)
        if self._metrics and self._check.repeatable is not None:
            self._metrics.repeatable.labels((await self.model()).id).set(
                1.0 if self._check.repeatable else 0.0)

    async def check(self) -> Check:
        """Read the known prompt four ways (decision/selfcheck.py) with every slot of
        this service leased, so that no decision runs beside the reads."""
        scheme, ubatch = self.scheme, self._ubatch
        kwargs = _NO_THINKING
        question = choice_question(list(CHECK_OPTIONS))
        info, labels = await self._labels(len(question.names), kwargs)
        block, grammar = self._layout(question, tuple(label for label, _ in labels))
        width = self._n_probs

        async def tokens_of(text: str) -> tuple[tuple[int, ...], int]:
            convo = append_to_conversation(state_messages(text), block)
            found = await self._prompt(convo, block, kwargs, ubatch)
            if found is None:
                raise UpstreamBadResponse("the chat template hides the question")
            return found

        known, other, opening = [await tokens_of(t) for t in (CHECK_TEXT, OTHER_TEXT, "Hi.")]
        book = await self._book()
        reads = []
        async with contextlib.AsyncExitStack() as stack:
            slots = [await stack.enter_async_context(book.lease(())) for _ in range(book.size)]
            a, b = slots[0], slots[-1]

            async def read(slot: int, prompt: tuple[tuple[int, ...], int]) -> dict:
                done, _ = await self._repeatable(book, slot, *prompt, width, grammar, ubatch)
                return done.logprobs

            book.holds[a] = None
            reads.append(await read(a, known))
            await read(a, other)
            reads.append(await read(a, known))
            reads.append(await read(a, known))
            await read(b, opening)
            reads.append(await read(b, known))
        same, detail = compare(reads)
        if len(slots) < 2:
            detail += " (one slot: the other-slot read used the same one)"
        return Check(scheme, same, detail, time.time())

    async def _labels(
        self, n: int, kwargs: Mapping[str, Any]
    ) -> tuple[ModelInfo, tuple[tuple[str, int], ...]]:
        """The served model and ``n`` labels verified in its template's answer context."""
        key = (_NO_THINKING_KEY if kwargs is _NO_THINKING
               else orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS).decode())
        if len(key) > _MAX_KWARGS_CHARS:
            raise InvalidRequest(f"chat_template_kwargs is over {_MAX_KWARGS_CHARS} characters",
                                 param="chat_template_kwargs")
        known = self._assigned.get((key, n))
        if known is not None and known[0] is self._info:
            return known  # the common case: a known template and option count, same model
        async with self._lock:
            info = await self.model()
            context = self._contexts.get(key)
            if context is None:
                probe = [{"role": "user", "content": "Question.\n\n" + ANSWER_INSTRUCTION}]
                try:
                    context = answer_context(await self._upstream.render(probe, kwargs))
                except ValueError as exc:
                    raise UpstreamBadResponse(
                        "the chat template dropped the question (no answer position)") from exc
                if len(self._contexts) >= _MAX_TEMPLATES:  # callers choose the kwargs: bounded
                    old_key = next(iter(self._contexts))
                    evicted = self._contexts.pop(old_key)
                    if evicted not in self._contexts.values():
                        self._token_ids.pop(evicted, None)
                    for stale in [k for k in self._assigned if k[0] == old_key]:
                        del self._assigned[stale]
                self._contexts[key] = context
            ids = self._token_ids.setdefault(context, {})
            await self._verify_until(n, context, ids)
            try:
                assigned = tuple(assign_labels(n, ids))
            except LabelError as exc:
                raise InvalidRequest(
                    f"{exc}: this model can answer at most {_usable(ids)} options",
                    code="too_many_options") from exc
            self._assigned[(key, n)] = (info, assigned)
        return info, assigned

    async def _verify_until(self, n: int, context: str, ids: dict[str, int | None]) -> None:
        """Tokenise candidates in context, in order, until ``n`` are usable (or none are left)."""
        if _usable(ids) >= n:
            return
        pending = [c for c in CANDIDATES if c not in ids]
        base: list[int] | None = None
        while _usable(ids) < n and pending:
            if base is None:
                base = await self._upstream.tokenize(context)
            batch, pending = pending[:_TOKENIZE_BATCH], pending[_TOKENIZE_BATCH:]
            encoded = await asyncio.gather(*(self._upstream.tokenize(context + c) for c in batch))
            for label, with_label in zip(batch, encoded):
                ids[label] = single_token_id(base, with_label)

    def _layout(self, question: Question, names: tuple[str, ...]) -> tuple[str, str]:
        """The options block and the grammar for these options and labels, remembered:
        most traffic asks the same few questions again and again."""
        key = (question.kind, question.instructions, question.shown, names)
        layout = self._layouts.get(key)
        if layout is None:
            layout = (options_block(question, names), gbnf_alternatives(names))
            if len(layout[0]) <= _MAX_LAYOUT_CHARS:  # callers choose the options: bounded
                if len(self._layouts) >= _MAX_LAYOUTS:
                    del self._layouts[next(iter(self._layouts))]
                self._layouts[key] = layout
        return layout

    def _forget(self) -> None:
        self._info = self._slots = self._reranks = None
        if self._slot_book is not None:  # kept: decisions in flight hold its leases
            self._slot_book.forget()
        self._prompts.clear()
        self._segments.clear()
        self._content_free.clear()  # another model's content-free answers
        self._contexts.clear()
        self._token_ids.clear()
        self._assigned.clear()


def worker_slots(total: int, index: int, workers: int) -> list[int]:
    """The llama-server slots worker ``index`` of ``workers`` leases: every ``workers``-th
    from ``index``, so no two workers lease one slot; a worker beyond the slot count
    shares one (its reads may then meet another worker's: ``semif_unrepeatable_reads``)."""
    mine = list(range(index, total, workers))
    return mine or [index % total]


def _remember(cache: dict, key: Any, value: Any, limit: int) -> None:
    if len(cache) >= limit:
        del cache[next(iter(cache))]
    cache[key] = value


def _text_only(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every message's content is text (a string or text parts only)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                return False
        elif content is not None and not isinstance(content, str):
            return False
    return True


def _usable(ids: Mapping[str, int | None]) -> int:
    return len({tid for tid in ids.values() if tid is not None})
