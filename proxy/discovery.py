"""What one llama-server (or one model of a router) serves, asked once and remembered
until another model answers: the model, its parallel slots, whether it is a reranker."""

from __future__ import annotations

from .facts import Facts
from .upstream import ModelInfo, Upstream

__all__ = ["Discovery"]


class Discovery:
    def __init__(self, upstream: Upstream):
        self._upstream = upstream
        self._info: ModelInfo | None = None
        self._slots: int | None = None
        self._reranks: bool | None = None  # a --reranking llama-server: see reranks

    @property
    def known(self) -> ModelInfo | None:
        """The model as last asked (None before the first answer or after ``forget``)."""
        return self._info

    async def model(self, facts: Facts | None = None) -> ModelInfo:
        """What llama-server serves (cached; refreshed when another model answers).
        ``facts``: the request's that waits for the answer (proxy/facts.py)."""
        if self._info is None:
            self._info = await self._upstream.model_info(facts)
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

    async def total_slots(self, facts: Facts | None = None) -> int:
        """llama-server's parallel slots (asked once)."""
        if self._slots is None:
            self._slots = await self._upstream.total_slots(facts) or 1
        return self._slots

    def forget(self) -> None:
        """Another model answered: ask everything again."""
        self._info = self._slots = self._reranks = None
