"""What a read costs on this llama-server, learned from its own answers.

Each ``/completion`` request a decision makes is one of three kinds of step: a
batch of 64 tokens or more (the segment scheme's cold shared segment, in the
tiled kernel), a chunk of 2 to 63 tokens (everything the prefix scheme
evaluates) or a one-token read (the last row, its sampling and its
log-probabilities). The seconds llama-server reports for a step (``timings``:
``prompt_ms`` plus ``predicted_ms``) are modelled per kind as

    seconds = a * e + b * e * (k + e / 2)

for ``e`` tokens evaluated after ``k`` reused: ``a`` the cost of a token's
weights, ``b`` of its attention over the rows before it (on average
``k + e / 2`` of them). ``a`` and ``b`` are fitted by least squares on the cost
per token (``seconds / e = a + b * (k + e / 2)``), each step counting once and the
older ones less (``FORGET`` per step): fitted on seconds, one 500-token step would
outweigh a hundred 50-token ones, and a slow moment during one long read (the
self-check's, at start-up) would set the estimates for the many short decisions
after it. The steps are taken from those
that ran while no other step of this process did: llama-server shares its
threads among the slots it evaluates together, so a step that ran beside
others took longer than it costs. The time around llama-server's own (HTTP,
JSON) is a moving average per step. Past the furthest position a kind was seen
at, a step is costed at that position's cost per token: ``b`` is not
extrapolated. Until a kind has been seen, its neighbour stands in (a batch
costs what a chunk does and vice versa); until none has, nothing is estimated
(``None``). A state kept from an earlier run (``state``, ``restore``: the self-check's
verdict keeps it) is a prior that weighs as one step of this run's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "StepCost",
    "CostModel",
    "ONE",
    "CHUNK",
    "BATCH",
    "DEFAULT_UBATCH",
    "GGML_FA_TILE_Q",
    "kind_of",
]

ONE, CHUNK, BATCH = "one", "chunk", "batch"
FORGET = 0.97  # weight of the previous steps when a new one is fitted in
_OVERHEAD_SMOOTHING = 0.1
DEFAULT_UBATCH = 512  # llama-server's -ub when it is not known
GGML_FA_TILE_Q = 64
"""llama.cpp's flash-attention tile (``GGML_FA_TILE_Q``): on the CPU, a batch of at least
this many tokens goes through the tiled kernel, a smaller one through the per-row kernel.
The one place that number lives: ``kv.MAX_SMALL_CHUNK``, the largest chunk kept out of the
tiled kernel, is ``GGML_FA_TILE_Q - 1``."""
PRIOR_STEPS = 1.0  # what a kept state weighs against this run's steps (``restore``)
_FIT = "per-token"  # what ``state()``'s sums are sums of; a state fitted otherwise is not taken


def kind_of(evaluated: int, ubatch: int) -> str:
    """The kind of step that evaluates ``evaluated`` tokens with physical batch ``ubatch``
    (0: unknown, taken as llama-server's default, ``DEFAULT_UBATCH``)."""
    if evaluated <= 1:
        return ONE
    if evaluated >= GGML_FA_TILE_Q and (ubatch == 0 or ubatch >= GGML_FA_TILE_Q):
        return BATCH
    return CHUNK


@dataclass
class StepCost:
    """``a * e + b * e * (k + e / 2)`` seconds, fitted by forgetting least squares on the
    cost per token: ``seconds / e`` against ``1`` and ``k + e / 2``, one weight per step."""

    sxx: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # x1x1, x1x2, x2x2
    sxy: list[float] = field(default_factory=lambda: [0.0, 0.0])
    a: float | None = None
    b: float = 0.0
    # the furthest average position (k + e / 2) seen: the attention term is not
    # extrapolated past it
    reach: float = 0.0

    def add(self, evaluated: int, cached: int, seconds: float) -> None:
        if evaluated < 1:
            return
        x1 = 1.0
        x2 = cached + evaluated / 2
        seconds /= evaluated  # the cost per token
        self.reach = max(self.reach, x2)
        s, t = self.sxx, self.sxy
        s[0] = FORGET * s[0] + x1 * x1
        s[1] = FORGET * s[1] + x1 * x2
        s[2] = FORGET * s[2] + x2 * x2
        t[0] = FORGET * t[0] + x1 * seconds
        t[1] = FORGET * t[1] + x2 * seconds
        det = s[0] * s[2] - s[1] * s[1]
        a = b = None
        if det > 1e-9 * s[0] * s[2]:  # two unknowns, told apart by the steps' lengths
            a = (t[0] * s[2] - s[1] * t[1]) / det
            b = (s[0] * t[1] - s[1] * t[0]) / det
        if a is None or a <= 0 or b < 0:  # one unknown: the cost per token, as measured
            a, b = t[0] / s[0], 0.0
        self.a, self.b = a, b

    def seconds(self, evaluated: int, cached: int) -> float | None:
        """The fitted seconds; past the positions seen, at the furthest one's cost per
        token (a ``b`` fitted on short steps is mostly noise, and a quadratic grown from
        noise would refuse long prompts a server can read)."""
        if self.a is None:
            return None
        return self.a * evaluated + self.b * evaluated * min(cached + evaluated / 2, self.reach)


class CostModel:
    """The three kinds of step (``kind_of``) and the time around them."""

    def __init__(self) -> None:
        self.steps = {ONE: StepCost(), CHUNK: StepCost(), BATCH: StepCost()}
        self.overhead_s = 0.0
        self.observed = 0

    def observe(
        self, kind: str, evaluated: int, cached: int, upstream_s: float, wall_s: float
    ) -> None:
        """A step that ran alone: ``upstream_s`` by llama-server's timings, ``wall_s`` as
        this process waited for it."""
        self.steps[kind].add(evaluated, cached, upstream_s)
        extra = max(0.0, wall_s - upstream_s)
        self.overhead_s = (
            extra
            if self.observed == 0
            else (1 - _OVERHEAD_SMOOTHING) * self.overhead_s + _OVERHEAD_SMOOTHING * extra
        )
        self.observed += 1

    def state(self) -> dict[str, object]:
        """What was learned, as JSON (kept with the self-check's verdict: proxy/verdicts.py)."""
        return {
            "fit": _FIT,
            "steps": {
                kind: {"sxx": c.sxx, "sxy": c.sxy, "a": c.a, "b": c.b, "reach": c.reach}
                for kind, c in self.steps.items()
            },
            "overhead_s": self.overhead_s,
            "observed": self.observed,
        }

    def restore(self, state: Mapping[str, Any]) -> bool:
        """Take ``state`` (``state()``'s) when it is whole and fitted as this version fits;
        whether it was. It is a prior, not a measurement: each kind's sums are scaled to
        weigh as ``PRIOR_STEPS`` steps (their fit unchanged), and nothing is estimated from
        it until this run observes a step of its own (``step_s``). A state kept from a
        check that ran while the machine was busy (a CI run, another container starting)
        held costs five times the real ones; taken whole, it refused decisions at once as
        past their deadline, and a refused decision teaches nothing."""
        if not isinstance(state, Mapping) or state.get("fit") != _FIT:
            return False
        try:
            steps = {
                kind: StepCost(
                    [float(x) for x in c["sxx"]][:3],
                    [float(x) for x in c["sxy"]][:2],
                    None if c["a"] is None else float(c["a"]),
                    float(c["b"]),
                    float(c["reach"]),
                )
                for kind, c in state["steps"].items()
                if kind in self.steps
            }
            overhead = float(state["overhead_s"])
        except (KeyError, TypeError, ValueError, AttributeError):
            return False
        if set(steps) != set(self.steps) or any(
            len(c.sxx) != 3 or len(c.sxy) != 2 for c in steps.values()
        ):
            return False
        for c in steps.values():  # a prior: as much say as PRIOR_STEPS steps of this run
            if c.sxx[0] > PRIOR_STEPS:
                scale = PRIOR_STEPS / c.sxx[0]
                c.sxx = [x * scale for x in c.sxx]
                c.sxy = [y * scale for y in c.sxy]
        self.steps, self.overhead_s, self.observed = steps, overhead, 0  # this run's count
        return True

    def step_s(self, kind: str, evaluated: int, cached: int) -> float | None:
        """Seconds one step takes on an idle server, or None while nothing is known: before
        this run has observed a step of its own (a kept state alone estimates nothing)."""
        if self.observed == 0:
            return None
        order = {ONE: (ONE, CHUNK, BATCH), CHUNK: (CHUNK, BATCH, ONE), BATCH: (BATCH, CHUNK, ONE)}[
            kind
        ]
        for k in order:
            s = self.steps[k].seconds(evaluated, cached)
            if s is not None:
                return s + self.overhead_s
        return None
