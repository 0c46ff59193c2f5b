"""Position debiasing: three ways to keep the order of the options out of the answer.

Small models favour one position whatever the question (SmolLM2: the second).

- ``cyclic``: read the question under several cyclic orders of its options and
  average what each order said about each option (one read per rotation).
- ``pride`` (Zheng et al., "Large Language Models Are Not Robust Multiple Choice
  Selectors", ICLR 2024): estimate the model's prior over positions once, from
  cyclic reads of a small sample (no labels needed: ``position_prior``), store it
  in the calibration profile, and divide it out of every later single read.
- ``contextual`` (Zhao et al., "Calibrate Before Use", ICML 2021): read the same
  question about a content-free input ("N/A"), and divide that answer out of
  every answer to the same question template (one extra read per template).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from .question import Question
from .readout import Decision

__all__ = [
    "MAX_DEFAULT_ROTATIONS",
    "METHODS",
    "DebiasError",
    "parse_debias",
    "shifts",
    "rotate",
    "average",
    "divided",
    "divide_out",
    "question_prior",
    "position_prior",
]

MAX_DEFAULT_ROTATIONS = 8
METHODS = ("cyclic", "pride", "contextual")


class DebiasError(ValueError):
    pass


def parse_debias(spec: object, n_options: int) -> tuple[str | None, list[int]]:
    """The method and, for ``cyclic``, the shifts to read: ``None`` (no debiasing),
    ``"cyclic"``, ``{"method": "cyclic", "rotations": k}``, ``"pride"`` (the profile's
    position prior) or ``"contextual"`` (a content-free read per question template)."""
    if spec is None:
        return None, []
    if spec == "cyclic":
        return "cyclic", shifts(n_options)
    if spec in ("pride", "contextual"):
        return str(spec), []
    if (
        isinstance(spec, dict)
        and spec.get("method") == "cyclic"
        and set(spec) <= {"method", "rotations"}
    ):
        k = spec.get("rotations")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
            raise DebiasError("rotations must be an integer")
        return "cyclic", shifts(n_options, k)
    raise DebiasError(
        'debias must be "cyclic", {"method": "cyclic", "rotations": k}, "pride" or "contextual"'
    )


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

    def turn(seq: Sequence[str]) -> tuple[str, ...]:
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


def divided(probabilities: Sequence[float], weights: Sequence[float]) -> list[float]:
    """A preference divided out, position by position: p'_i = (p_i / w_i) / sum_j (p_j / w_j),
    w the position prior (PriDe) or the content-free answer (contextual calibration:
    W = diag(p_cf)^-1, b = 0)."""
    if len(weights) != len(probabilities) or not all(w > 0 for w in weights):
        raise ValueError("one positive weight per option")
    raw = [p / w for p, w in zip(probabilities, weights)]
    total = math.fsum(raw)
    return [r / total for r in raw]


def divide_out(decision: Decision, weights: Sequence[float]) -> Decision:
    """The decision with ``divided`` probabilities; the label mass stays the read's, the
    choice is their argmax (first on ties)."""
    out = tuple(divided(decision.probabilities, weights))
    best = max(range(len(out)), key=lambda i: out[i])
    return Decision(decision.question, out, decision.label_mass, best)


def question_prior(rotations: Sequence[Sequence[float]]) -> list[float]:
    """One question's prior over positions, from its reads under every cyclic shift (each
    read's probabilities by position shown): softmax_i((1/|I|) sum_I log p_I(position i)),
    Zheng et al.'s estimate (the option's own merit cancels over the shifts)."""
    if not rotations:
        raise ValueError("no reads")
    n = len(rotations[0])
    if any(len(r) != n for r in rotations):
        raise ValueError("every read needs one probability per position")
    logs = [
        math.fsum(math.log(max(r[i], 1e-300)) for r in rotations) / len(rotations) for i in range(n)
    ]
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    total = math.fsum(weights)
    return [w / total for w in weights]


def position_prior(questions: Sequence[Sequence[Sequence[float]]]) -> list[float]:
    """The model's prior over positions: the mean over the sample's questions of
    ``question_prior`` (all with the same number of options)."""
    if not questions:
        raise ValueError("no questions")
    priors = [question_prior(q) for q in questions]
    n = len(priors[0])
    if any(len(p) != n for p in priors):
        raise ValueError("one option count per prior")
    return [math.fsum(p[i] for p in priors) / len(priors) for i in range(n)]
