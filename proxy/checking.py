"""The repeatability self-check's life: when it runs, what it reads, what is kept.

``decision/selfcheck.py`` says what the check compares; this module runs it for one
served model:

- **when**: as soon as llama-server's slots are first counted, and each time llama-server
  came back after being away (``Reader.book`` calls ``start``); the app watches
  llama-server (proxy/app.py) so that both happen before ``/health`` says ready, and a
  decision does not wait for the check's reads. A check cut short by llama-server going
  away or not answering in time is due again; one that cannot run for another reason
  (no ``/props``, refused credentials) settles as "not checked";
- **what**: a known prompt read four ways with every slot leased (``check``); a failure is
  made again ``CHECK_ATTEMPTS`` times, and a prefix scheme that still fails falls back to
  the segment scheme, which is checked in turn;
- **what is kept**: a verdict that reads held, by what decides it (proxy/verdicts.py).
  Then nothing is read but the chat template's opening, into one slot (``_prime``);
- **how long**: ``CHECK_BOUND_S`` in all, retries included; past it the proxy serves
  unchecked (``repeatable: null``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

from .catalogue import NO_THINKING, LabelCatalogue
from .decision.prompt import append_to_conversation, state_messages
from .decision.question import choice_question
from .decision.selfcheck import CHECK_OPTIONS, CHECK_TEXT, OTHER_TEXT, Check, compare
from .errors import UpstreamBadResponse, UpstreamTimeout, UpstreamUnavailable
from .kv import common_prefix
from .metrics import Metrics
from .prompt_cache import PromptCache
from .reader import Reader
from .upstream import ModelInfo, Upstream
from .verdicts import Verdicts, file_stamp, verdict_key

__all__ = ["CHECK_ATTEMPTS", "CHECK_BOUND_S", "CHECK_PAUSE_S", "SelfCheck"]

log = logging.getLogger("proxy")

CHECK_ATTEMPTS = 3  # a failing self-check is made again, this many times in all ...
CHECK_PAUSE_S = (1.0, 3.0)  # ... after a pause of this many seconds (uniform)
# The whole self-check, retries included, at most: about
# 1,300 tokens, 175 s for the slow model (a 1B model's compute) on 2 AVX2 cores
# (docs/performance.md); past it the proxy serves unchecked (repeatable: null). Within the
# Kubernetes start-up probe's 20 minutes and SageMaker's 900 s start-up health check.
CHECK_BOUND_S = 600.0


class SelfCheck:
    """One served model's self-check. ``model``: the served model (for the gauge);
    ``enabled``: False in unit tests that read without one; ``verdicts``: the kept
    verdicts (None: this process's memory only)."""

    def __init__(
        self,
        upstream: Upstream,
        reader: Reader,
        prompts: PromptCache,
        catalogue: LabelCatalogue,
        *,
        n_probs: int,
        metrics: Metrics | None,
        model: Callable[[], Awaitable[ModelInfo]],
        enabled: bool,
        verdicts: Verdicts | None,
    ):
        self._upstream = upstream
        self._reader = reader
        self._prompts = prompts
        self._catalogue = catalogue
        self._n_probs = n_probs
        self._metrics = metrics
        self._model = model
        self._enabled = enabled
        self._verdicts = verdicts or Verdicts(None)
        self.result = Check(reader.scheme, None)
        self._task: asyncio.Task[None] | None = None
        self._due = False  # llama-server came back while a check ran, or it was cut short

    def start(self) -> None:
        """Check now, or once the check running ends (it read the server before)."""
        if not self._enabled:
            return
        if self._task is not None and not self._task.done():
            self._due = True
            return
        self._due = False
        self.result = Check(self._reader.scheme, None)
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def settled(self) -> bool:
        """Whether the check has settled (a verdict, kept or new, or "not checked"),
        starting it when due: the slots never counted, llama-server back since, or a check
        cut short. The readiness probes answer "checking" until then."""
        await self._reader.book()  # the first count, or a restart seen, starts it
        if self._due and (self._task is None or self._task.done()):
            self.start()
        return self._task is None or self._task.done()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run(self) -> None:
        """The check, within ``CHECK_BOUND_S``; logs and records its outcome."""
        started = time.monotonic()
        scheme = self._reader.scheme
        try:
            async with asyncio.timeout(CHECK_BOUND_S) as bound:
                await self._settle()
                if self._metrics and self.result.repeatable is not None:
                    model = await self._model()
                    self._metrics.repeatable.labels(model.id).set(float(self.result.repeatable))
        except TimeoutError as exc:
            if not bound.expired():  # llama-server did not answer a call in time
                self._not_checked(scheme, f"llama-server did not answer in time ({exc})", due=True)
                return
            log.warning(
                "the repeatability self-check took more than %.0fs (a slow model): the proxy "
                "serves unchecked, and answers say repeatable: null",
                CHECK_BOUND_S,
            )
            self.result = Check(scheme, None, f"not checked: over {CHECK_BOUND_S:.0f} s")
            return
        except (UpstreamUnavailable, UpstreamTimeout) as exc:
            self._not_checked(scheme, str(exc), due=True)  # gone or slow: check again
            return
        except Exception as exc:  # noqa: BLE001 - a check that cannot run decides nothing
            self._not_checked(scheme, str(exc), due=False)
            return
        log.info(
            "repeatability self-check on %s: %s in %.1fs (%s)",
            self.result.scheme,
            "repeatable" if self.result.repeatable else "not repeatable",
            time.monotonic() - started,
            self.result.detail,
        )
        if self.result.repeatable is False:
            log.warning(
                "repeatable reads failed the self-check (%s): answers say repeatable: false",
                self.result.detail,
            )

    def _not_checked(self, scheme: str, why: str, *, due: bool) -> None:
        log.warning(
            "the repeatability self-check could not run: %s%s",
            why,
            " (checked again once llama-server answers)" if due else "",
        )
        self.result = Check(scheme, None, f"not checked: {why}")
        self._due = self._due or due

    async def _settle(self) -> None:
        """The check, falling back to the segment scheme when the prefix scheme fails."""
        check = await self._again_if_it_fails()
        if check.repeatable is False and self._reader.ubatch:
            log.warning(
                "repeatable reads failed the self-check with the prefix scheme "
                "(%s); falling back to the segment scheme",
                check.detail,
            )
            self._reader.ubatch = 0
            self._reader.forget()
            self._prompts.forget_prompts()  # remembered without their segment's length
            check = await self._again_if_it_fails()
        self.result = check

    async def _again_if_it_fails(self) -> Check:
        """A kept verdict for this server as it is now, else ``check``, made again after a
        pause while it fails, ``CHECK_ATTEMPTS`` times at most. Reads of other slots
        evaluated in the same llama-server batches change the kernels a read goes through
        (llama.cpp gives each sequence of a batch as many tokens as the one with fewest: a
        one-token read or a generation's token beside a prompt makes that prompt's rows
        one-token rows too): a relayed generation or a request sent to llama-server directly
        can make one check fail, where a build whose kernels differ fails every time."""
        key = await self._key()
        kept = self._verdicts.get(key)
        if kept is not None:
            costs = self._verdicts.costs(key)
            if costs is not None and self._reader.cost.observed == 0:
                self._reader.cost.restore(costs)  # what the check's reads would have taught
            await self._prime()
            return kept
        check = await self.check()
        for attempt in range(1, CHECK_ATTEMPTS):
            if check.repeatable is not False:
                break
            log.info(
                "the repeatability self-check failed (%s), attempt %d of %d; checking again",
                check.detail,
                attempt,
                CHECK_ATTEMPTS,
            )
            await asyncio.sleep(random.uniform(*CHECK_PAUSE_S))
            check = await self.check()
        self._verdicts.put(key, check, self._reader.cost.state())
        return check

    async def _key(self) -> str:
        """What decides this server's verdict (proxy/verdicts.py), asked anew each time:
        llama-server may have come back as another build or with another model."""
        identity = await self._upstream.identity()
        book = await self._reader.book()
        return verdict_key(
            identity,
            model_file=file_stamp(str(identity.get("path") or "")),
            cpu=self._verdicts.cpu,
            scheme=self._reader.scheme,
            slots=book.size,
        )

    async def _prime(self) -> None:
        """With a kept verdict nothing was read: read the chat template's opening (what any
        two conversations share: the common prefix of two one-word prompts) into one slot,
        as the check's reads would have left it, so that the first decision after a start or
        a restart reuses it as every later one does (the prefix scheme; the segment scheme
        reuses only whole segments). A few dozen tokens: seconds on a slow model."""
        ubatch = self._reader.ubatch
        if not ubatch:
            return
        question = choice_question(list(CHECK_OPTIONS))
        _, labels = await self._catalogue.labels(len(question.names), NO_THINKING)
        block = self._prompts.layout(question, tuple(label for label, _ in labels))
        prompts = []
        for word in ("Hi.", "Yes."):
            convo = append_to_conversation([{"role": "user", "content": word}], block)
            found = await self._prompts.prompt(convo, block, NO_THINKING, ubatch)
            if found is None:
                return
            prompts.append(found[0])
        opening = prompts[0][: common_prefix(*prompts)]
        if len(opening) < 2:
            return
        book = await self._reader.book()
        async with book.lease(()) as slot:
            await self._reader.read(book, slot, opening, len(opening), 1, ubatch, teach=False)

    async def check(self) -> Check:
        """Read the known prompt four ways (decision/selfcheck.py) with every slot of
        this service leased, so that no decision runs beside the reads."""
        scheme, ubatch = self._reader.scheme, self._reader.ubatch
        kwargs = NO_THINKING
        question = choice_question(list(CHECK_OPTIONS))
        _, labels = await self._catalogue.labels(len(question.names), kwargs)
        block = self._prompts.layout(question, tuple(label for label, _ in labels))
        width = self._n_probs

        async def tokens_of(text: str) -> tuple[tuple[int, ...], int]:
            convo = append_to_conversation(state_messages(text), block)
            found = await self._prompts.prompt(convo, block, kwargs, ubatch)
            if found is None:
                raise UpstreamBadResponse("the chat template hides the question")
            return found

        known, other, opening = [await tokens_of(t) for t in (CHECK_TEXT, OTHER_TEXT, "Hi.")]
        book = await self._reader.book()
        reads = []
        async with contextlib.AsyncExitStack() as stack:
            slots = [await stack.enter_async_context(book.lease(())) for _ in range(book.size)]
            a, b = slots[0], slots[-1]

            async def read(slot: int, prompt: tuple[tuple[int, ...], int]) -> dict:
                done, _ = await self._reader.read(book, slot, *prompt, width, ubatch)
                return done.logprobs

            book.contents[a] = None
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
