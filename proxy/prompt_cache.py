"""Prompts as llama-server makes them, remembered: each question's options block,
each conversation's rendering and tokens, and the tokens of the shared
segment before the options (the segment scheme of ``proxy/kv.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from .bounded import BoundedCache
from .decision.prompt import options_block
from .decision.question import Question
from .facts import Facts
from .kv import common_prefix
from .upstream import Upstream

__all__ = ["PromptCache", "Prompt"]

_MAX_LAYOUTS = 512  # distinct (options, labels) layouts remembered ...
_MAX_LAYOUT_CHARS = 8192  # ... each at most this long: at most ~10 MB in all
_MAX_PROMPTS = 256  # rendered and tokenised prompts remembered ...
_MAX_PROMPT_KEY = 64 * 1024  # ... for conversations up to this size (JSON bytes)
_MAX_SEGMENTS = 64  # shared segments (states, conversations) tokenised, remembered

# a prompt's tokens and the length of its shared segment (0 with the prefix scheme)
Prompt = tuple[tuple[int, ...], int]


class PromptCache:
    def __init__(self, upstream: Upstream):
        self._upstream = upstream
        self._layouts: BoundedCache[tuple[Any, ...], str] = BoundedCache(_MAX_LAYOUTS)
        self._prompts: BoundedCache[bytes, Prompt] = BoundedCache(_MAX_PROMPTS)
        self._segments: BoundedCache[str, tuple[int, ...]] = BoundedCache(_MAX_SEGMENTS)

    def layout(self, question: Question, names: tuple[str, ...]) -> str:
        """The options block for these options and labels, remembered:
        most traffic asks the same few questions again and again."""
        key = (question.kind, question.instructions, question.shown, names)
        layout = self._layouts.get(key)
        if layout is None:
            layout = options_block(question, names)
            if len(layout) <= _MAX_LAYOUT_CHARS:  # callers choose the options: bounded
                self._layouts.put(key, layout)
        return layout

    async def prompt(
        self,
        convo: list[dict[str, Any]],
        block: str,
        kwargs: Mapping[str, Any],
        ubatch: int,
        facts: Facts | None = None,
    ) -> Prompt | None:
        """The prompt's tokens (as llama-server's chat endpoint would make them) and the
        length of its shared segment: the tokens it has in common with the text before
        the options block tokenised alone (whitespace before the block may tokenise
        differently in context); with the prefix scheme (``ubatch``), 0. Remembered;
        ``None`` when the template hides the block. ``facts``: the request's that waits
        for it (proxy/facts.py)."""
        key = orjson.dumps([convo, dict(kwargs), ubatch], option=orjson.OPT_SORT_KEYS)
        known = self._prompts.get(key)
        if known is not None:
            return known
        rendered = await self._upstream.render(convo, kwargs, facts)
        at = rendered.rfind(block)
        if at <= 0:
            return None
        if ubatch:  # the prefix scheme: no segment, one /tokenize
            tokens = tuple(await self._upstream.tokenize(rendered, special=True, facts=facts))
            if len(tokens) < 2:
                return None
            found = (tokens, 0)
        else:
            segment = self._segments.get(rendered[:at])
            if segment is None:
                segment = tuple(
                    await self._upstream.tokenize(rendered[:at], special=True, facts=facts)
                )
                if at <= _MAX_PROMPT_KEY:  # callers choose the text: bounded
                    self._segments.put(rendered[:at], segment)
            tokens = tuple(await self._upstream.tokenize(rendered, special=True, facts=facts))
            shared = common_prefix(segment, tokens)
            if not 0 < shared < len(tokens):
                return None
            found = (tokens, shared)
        if len(key) <= _MAX_PROMPT_KEY:
            self._prompts.put(key, found)
        return found

    def forget_prompts(self) -> None:
        """The read scheme changed: prompts were remembered with the old one's segments."""
        self._prompts.clear()

    def forget(self) -> None:
        """Another model answers: its template and tokenizer are another's (the options
        layouts depend on neither)."""
        self._prompts.clear()
        self._segments.clear()
