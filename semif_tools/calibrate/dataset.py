"""Labelled data for calibration: JSONL, one System One request with one question per line,
plus its gold answer at the top level::

    {"state": "I was charged twice.", "questions": {"team": {"type": "choice",
     "criteria": {"billing": null, "shipping": null}}}, "gold": "billing"}

``gold`` is the option name (choice), the level index (score) or true/false (noul).
Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

__all__ = ["DataError", "Item", "parse_item", "records", "load_items", "data_sha256"]


class DataError(ValueError):
    """A line of the labelled data is unusable; the message names file and line."""


@dataclass(frozen=True)
class Item:
    source: str  # "file:line"
    body: dict[str, Any]  # the System One request, without "gold"
    qid: str
    kind: str
    names: tuple[str, ...]  # option names in option order (score "0".."n-1", noul true, false)
    gold: int  # index into names


def _names(kind: str, criteria: Any) -> tuple[str, ...]:
    if kind == "noul":
        return ("true", "false")
    if kind == "score":
        if not isinstance(criteria, list):
            raise ValueError("score criteria must be a list of levels")
        return tuple(str(i) for i in range(len(criteria)))
    if isinstance(criteria, Mapping):
        return tuple(criteria)
    if isinstance(criteria, list) and all(isinstance(n, str) for n in criteria):
        return tuple(criteria)
    raise ValueError("choice criteria must be an object of name: description or a list of names")


def _gold_index(kind: str, names: tuple[str, ...], gold: Any) -> int:
    if kind == "noul":
        if not isinstance(gold, bool):
            raise ValueError(f"noul gold must be true or false, got {gold!r}")
        return 0 if gold else 1
    if kind == "score":
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(names):
            raise ValueError(f"score gold must be a level index 0..{len(names) - 1}, got {gold!r}")
        return gold
    if gold not in names:
        raise ValueError(f"choice gold {gold!r} is not one of the options {list(names)}")
    return names.index(gold)


def parse_item(data: Any, source: str = "<item>") -> Item:
    try:
        if not isinstance(data, dict):
            raise ValueError("each line must be a JSON object")
        if "gold" not in data:
            raise ValueError('missing "gold"')
        body = {k: v for k, v in data.items() if k != "gold"}
        questions = body.get("questions")
        if not isinstance(questions, dict) or len(questions) != 1:
            raise ValueError('"questions" must hold exactly one question')
        ((qid, question),) = questions.items()
        kind = question.get("type") if isinstance(question, dict) else None
        if kind not in ("choice", "score", "noul"):
            raise ValueError(f"question type must be choice, score or noul, got {kind!r}")
        names = _names(kind, question.get("criteria"))
        return Item(source, body, qid, kind, names, _gold_index(kind, names, data["gold"]))
    except ValueError as exc:
        raise DataError(f"{source}: {exc}") from exc


def records(paths: Iterable[Path | str]) -> Iterator[tuple[str, Any]]:
    """("file:line", parsed JSON) for every line of the files in order; blank lines and
    ``#`` comments skipped, a line that is not JSON refused with its place."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                source = f"{path}:{number}"
                try:
                    yield source, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{source}: not JSON: {exc}") from exc


def load_items(paths: Iterable[Path | str], limit: int | None = None) -> list[Item]:
    """Items of all files in order; ``limit`` keeps the first N."""
    return [parse_item(data, source) for source, data in islice(records(paths), limit)]


def data_sha256(paths: Iterable[Path | str]) -> str:
    """sha256 of the files' bytes, concatenated in the order given."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()
