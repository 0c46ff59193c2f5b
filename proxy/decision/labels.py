"""Labels: the short strings the model answers with, one token each.

Candidates are tried in a fixed order (A-Z, then AA..ZZ, then a-z and 0-9).
A candidate is usable for a model only if, right after the prompt's answer
position, it encodes as exactly one token, and that token differs from every
other label's. The proxy checks this with the served model's own tokenizer
(``single_token_id``) and assigns the first usable candidates in order.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from itertools import product

__all__ = ["CANDIDATES", "LabelError", "single_token_id", "assign_labels", "gbnf_alternatives"]

CANDIDATES: tuple[str, ...] = (
    *string.ascii_uppercase,
    *("".join(p) for p in product(string.ascii_uppercase, repeat=2)),
    *string.ascii_lowercase,
    *string.digits,
)


class LabelError(ValueError):
    pass


def single_token_id(context_ids: Sequence[int], with_label_ids: Sequence[int]) -> int | None:
    """The label's token id if appending it to the context added exactly one token.

    ``context_ids`` is the tokenisation of the text before the answer position,
    ``with_label_ids`` that of the same text with the label appended. Any other
    outcome (two tokens, or the label merging with the context) is ``None``.
    """
    n = len(context_ids)
    if len(with_label_ids) != n + 1 or list(with_label_ids[:n]) != list(context_ids):
        return None
    return with_label_ids[n]


def assign_labels(n: int, token_ids: Mapping[str, int | None]) -> list[tuple[str, int]]:
    """The first ``n`` candidates, in ``CANDIDATES`` order, that are distinct single tokens."""
    chosen: list[tuple[str, int]] = []
    used: set[int] = set()
    for label in CANDIDATES:
        tid = token_ids.get(label)
        if tid is None or tid in used:
            continue
        chosen.append((label, tid))
        used.add(tid)
        if len(chosen) == n:
            return chosen
    raise LabelError(f"the served model has only {len(chosen)} single-token labels; {n} needed")


def gbnf_alternatives(labels: Sequence[str]) -> str:
    """A GBNF grammar accepting exactly one of the labels (labels are ASCII alphanumerics):
    what a client reading the decision through llama-server's chat endpoint itself would
    send (the benchmarks' calls by hand). The proxy's reads send none: llama-server
    reports the log-probabilities before any grammar, which only chooses the generated
    token, and no decision uses that token."""
    if not labels or not all(lbl.isascii() and lbl.isalnum() for lbl in labels):
        raise LabelError("labels must be non-empty ASCII alphanumerics")
    return "root ::= " + " | ".join(f'"{lbl}"' for lbl in labels)
