"""The labels a served model can answer with, per chat template.

A label is usable when it is one token at the answer position of the template's
rendering (``decision/labels.py``); which candidates are depends on the text before
that position, so each distinct ``chat_template_kwargs`` is probed once (one
``/apply-template``), and each answer context's candidates are tokenised once, in
order, until as many are usable as a question has options.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import orjson

from .bounded import BoundedCache
from .decision.labels import CANDIDATES, LabelError, assign_labels, single_token_id
from .decision.prompt import ANSWER_INSTRUCTION, answer_context
from .discovery import Discovery
from .errors import InvalidRequest, UpstreamBadResponse
from .facts import Facts
from .upstream import ModelInfo, Upstream

__all__ = ["LabelCatalogue", "NO_THINKING", "Labels", "rendering_kwargs"]

NO_THINKING: Mapping[str, Any] = MappingProxyType({"enable_thinking": False})  # the default
_NO_THINKING_KEY = orjson.dumps(dict(NO_THINKING), option=orjson.OPT_SORT_KEYS).decode()
_MAX_TEMPLATES = 32  # distinct chat_template_kwargs remembered
_MAX_KWARGS_CHARS = 4096
_TOKENIZE_BATCH = 32

# the labels assigned for an option count: (label, its token id) in the options' order
Labels = tuple[tuple[str, int], ...]


def rendering_kwargs(given: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The template kwargs a decision renders with: thinking off unless asked for."""
    return {"enable_thinking": False, **given} if given else NO_THINKING


class LabelCatalogue:
    def __init__(self, upstream: Upstream, discovery: Discovery):
        self._upstream = upstream
        self._discovery = discovery
        self._lock = asyncio.Lock()
        # template kwargs (JSON) -> answer context; callers choose the kwargs: bounded
        self._contexts: BoundedCache[str, str] = BoundedCache(_MAX_TEMPLATES, self._evicted)
        self._token_ids: dict[str, dict[str, int | None]] = {}  # context -> label -> id
        # (template kwargs, option count) -> the model and the labels assigned for it:
        # the lock-free fast path, used only while that model is still the one served
        self._assigned: dict[tuple[str, int], tuple[ModelInfo, Labels]] = {}

    async def labels(
        self, n: int, kwargs: Mapping[str, Any], facts: Facts | None = None
    ) -> tuple[ModelInfo, Labels]:
        """The served model and ``n`` labels verified in its template's answer context.
        ``facts``: the request's that waits for them (proxy/facts.py)."""
        key = (
            _NO_THINKING_KEY
            if kwargs is NO_THINKING
            else orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS).decode()
        )
        if len(key) > _MAX_KWARGS_CHARS:
            raise InvalidRequest(
                f"chat_template_kwargs is over {_MAX_KWARGS_CHARS} characters",
                param="chat_template_kwargs",
            )
        known = self._assigned.get((key, n))
        if known is not None and known[0] is self._discovery.known:
            return known  # the common case: a known template and option count, same model
        async with self._lock:
            info = await self._discovery.model(facts)
            context = self._contexts.get(key)
            if context is None:
                probe = [{"role": "user", "content": "Question.\n\n" + ANSWER_INSTRUCTION}]
                try:
                    context = answer_context(await self._upstream.render(probe, kwargs, facts))
                except ValueError as exc:
                    raise UpstreamBadResponse(
                        "the chat template dropped the question (no answer position)"
                    ) from exc
                self._contexts.put(key, context)
            ids = self._token_ids.setdefault(context, {})
            await self._verify_until(n, context, ids, facts)
            try:
                assigned = tuple(assign_labels(n, ids))
            except LabelError as exc:
                raise InvalidRequest(
                    f"{exc}: this model can answer at most {_usable(ids)} options",
                    code="too_many_options",
                ) from exc
            self._assigned[(key, n)] = (info, assigned)
        return info, assigned

    def forget(self) -> None:
        """Another model answers: its template and vocabulary are another's."""
        self._contexts.clear()
        self._token_ids.clear()
        self._assigned.clear()

    def _evicted(self, key: str, context: str) -> None:
        if context not in self._contexts.values():
            self._token_ids.pop(context, None)
        for stale in [k for k in self._assigned if k[0] == key]:
            del self._assigned[stale]

    async def _verify_until(
        self, n: int, context: str, ids: dict[str, int | None], facts: Facts | None
    ) -> None:
        """Tokenise candidates in context, in order, until ``n`` are usable (or none are left)."""
        if _usable(ids) >= n:
            return
        pending = [c for c in CANDIDATES if c not in ids]
        base: list[int] | None = None
        while _usable(ids) < n and pending:
            if base is None:
                base = await self._upstream.tokenize(context, facts=facts)
            batch, pending = pending[:_TOKENIZE_BATCH], pending[_TOKENIZE_BATCH:]
            encoded = await asyncio.gather(
                *(self._upstream.tokenize(context + c, facts=facts) for c in batch)
            )
            for label, with_label in zip(batch, encoded):
                ids[label] = single_token_id(base, with_label)


def _usable(ids: Mapping[str, int | None]) -> int:
    return len({tid for tid in ids.values() if tid is not None})
