"""From label log-probabilities to an answer.

All formulas are the published ones (System One / SemIf); each lives in one
function whose docstring states it. Inputs are the exact log-probabilities the
model gave each label token, in option order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .question import Question

__all__ = [
    "Decision",
    "normalise",
    "label_mass",
    "choice_confidence",
    "score_confidence",
    "expected_level",
    "decide",
    "system_one_answer",
]


@dataclass(frozen=True)
class Decision:
    question: Question
    probabilities: tuple[float, ...]  # in option order, sum to 1
    label_mass: float
    best: int  # index of the most likely option (first on ties)

    @property
    def best_name(self) -> str:
        return self.question.names[self.best]


def normalise(logprobs: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Softmax of the label log-probabilities divided by the temperature:
    p_i = exp(l_i / T) / sum_j exp(l_j / T), computed as exp((l_i - max_j l_j) / T)."""
    if not logprobs:
        raise ValueError("no log-probabilities")
    if not temperature > 0 or not math.isfinite(temperature):
        raise ValueError("temperature must be a positive finite number")
    top = max(logprobs)
    if not math.isfinite(top):
        raise ValueError("every label has zero probability")
    # shift before dividing: a tiny temperature then sharpens instead of overflowing
    weights = [math.exp((lp - top) / temperature) for lp in logprobs]
    total = math.fsum(weights)
    return [w / total for w in weights]


def label_mass(logprobs: Sequence[float]) -> float:
    """Raw probability mass of the labels: sum_i exp(l_i), before any normalising."""
    return math.fsum(math.exp(lp) for lp in logprobs)


def choice_confidence(probs: Sequence[float]) -> float:
    """(n * max_i p_i - 1) / (n - 1), clipped to [0, 1]: 0 when uniform, 1 when certain."""
    n = len(probs)
    return min(1.0, max(0.0, (n * max(probs) - 1.0) / (n - 1)))


def score_confidence(probs: Sequence[float]) -> float:
    """max(0, 1 - sum_i p_i |i - mode| / D), mode the most likely level and
    D = (1/n) sum_i |i - (n-1)/2|, the mean distance of the levels from the middle."""
    n = len(probs)
    mode = max(range(n), key=lambda i: probs[i])
    spread = math.fsum(abs(i - (n - 1) / 2) for i in range(n)) / n
    deviation = math.fsum(p * abs(i - mode) for i, p in enumerate(probs))
    return max(0.0, 1.0 - deviation / spread)


def expected_level(probs: Sequence[float]) -> float:
    """The probability-weighted level: sum_i i * p_i."""
    return math.fsum(i * p for i, p in enumerate(probs))


def decide(question: Question, logprobs: Sequence[float]) -> Decision:
    if len(logprobs) != len(question.names):
        raise ValueError("one log-probability per option")
    probs = normalise(logprobs, question.temperature)
    # from the log-probabilities, first on ties: no temperature or rounding can move it
    best = max(range(len(logprobs)), key=lambda i: logprobs[i])
    return Decision(question, tuple(probs), label_mass(logprobs), best)


def system_one_answer(decision: Decision) -> dict[str, Any]:
    """The answer object in System One form (without extensions)."""
    q, probs = decision.question, decision.probabilities
    by_name = dict(zip(q.names, probs))
    if q.kind == "choice":
        return {
            "type": "choice",
            "choice": decision.best_name,
            "probabilities": by_name,
            "confidence": choice_confidence(probs),
        }
    if q.kind == "score":
        return {
            "type": "score",
            "score": expected_level(probs),
            "legend": dict(zip(q.names, q.legend if q.legend is not None else q.shown)),
            "probabilities": by_name,
            "confidence": score_confidence(probs),
        }
    return {"type": "noul", "noul": by_name["true"]}
