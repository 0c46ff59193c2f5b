"""Position debiasing: read a question under several cyclic orders of its options
and average what each order said about each option.

Small models favour the option shown first whatever the question; showing
every option in every position, equally often, cancels that preference out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from .question import Question
from .readout import Decision

__all__ = ["MAX_DEFAULT_ROTATIONS", "DebiasError", "parse_debias", "shifts", "rotate", "average"]

MAX_DEFAULT_ROTATIONS = 8


class DebiasError(ValueError):
    pass


def parse_debias(spec: object, n_options: int) -> list[int]:
    """``None`` (no debiasing), ``"cyclic"`` or ``{"method": "cyclic", "rotations": k}``."""
    if spec is None:
        return []
    if spec == "cyclic":
        return shifts(n_options)
    if isinstance(spec, dict) and spec.get("method") == "cyclic" and set(spec) <= {"method", "rotations"}:
        k = spec.get("rotations")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
            raise DebiasError("rotations must be an integer")
        return shifts(n_options, k)
    raise DebiasError('debias must be "cyclic" or {"method": "cyclic", "rotations": k}')


def shifts(n_options: int, rotations: int | None = None) -> list[int]:
    """The cyclic shifts to read: all n for up to 8 options (or ``rotations`` of
    them), spread evenly: shift_i = floor(i * n / k) for i in 0..k-1."""
    k = rotations if rotations is not None else min(n_options, MAX_DEFAULT_ROTATIONS)
    if not 1 <= k <= n_options:
        raise DebiasError(f"rotations must be between 1 and the number of options ({n_options})")
    return [i * n_options // k for i in range(k)]


def rotate(question: Question, shift: int) -> Question:
    """The same question with its options shown starting from option ``shift``."""
    if question.kind == "score":
        raise DebiasError("score levels are ordered; only choice and noul questions can be rotated")
    n = len(question.names)

    def turn(seq: Sequence) -> tuple:
        return tuple(seq[(shift + i) % n] for i in range(n))

    return replace(question, names=turn(question.names), shown=turn(question.shown))


def average(question: Question, reads: Sequence[tuple[int, Decision]]) -> Decision:
    """Mean over reads of each option's probability, mapped back to ``question``'s
    order: p_j = (1/k) sum_r p_r[(j - shift_r) mod n]. Label mass is averaged too."""
    n = len(question.names)
    probs = [0.0] * n
    for shift, decision in reads:
        for shown_at, p in enumerate(decision.probabilities):
            probs[(shift + shown_at) % n] += p
    k = len(reads)
    probs = [p / k for p in probs]
    total = math.fsum(probs)
    probs = [p / total for p in probs]
    best = max(range(n), key=lambda i: probs[i])
    mass = math.fsum(d.label_mass for _, d in reads) / k
    return Decision(question, tuple(probs), mass, best)
