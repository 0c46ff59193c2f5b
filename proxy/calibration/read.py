"""Reading labelled items through a running proxy's ``POST /v1/systemone``.

Each item is sent as it is, plus ``"x_calibration": "none"`` (so no profile is
applied) and, for debiased reads, ``"x_debias": "cyclic"`` or ``"contextual"``.
The answer's ``probabilities`` (choice, score) or ``noul``, its label mass and,
for cyclic reads, each rotation's probabilities by position become one
``Reading``. This is the only module of the package that speaks HTTP.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, TextIO

import httpx

from .dataset import Item
from .fit import Labelled

__all__ = ["ReadError", "Reading", "Progress", "served_model", "read_answers"]

_RETRY_STATUSES = (429, 502, 503, 504)
_ATTEMPTS = 4


class ReadError(RuntimeError):
    """The proxy could not answer an item; the message names the item and the status."""


@dataclass(frozen=True)
class Reading:
    kind: str
    probabilities: tuple[float, ...]  # option order; noul (P(true), P(false))
    gold: int
    prompt_format_version: str | None
    reads: int | None  # upstream reads the proxy needed (x_reads), when it says
    label_mass: float | None = None  # x_label_mass
    rotations: tuple[tuple[float, ...], ...] = ()  # cyclic: each shift's, by position shown
    read_scheme: str | None = None  # x_read_scheme: how the proxy evaluated the prompt

    @property
    def labelled(self) -> Labelled:
        return Labelled(self.kind, self.probabilities, self.gold, self.label_mass)


class Progress:
    """A one-line progress bar: ``label [#####-----] done/total pct rate``."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 30):
        self.total, self.label, self.width = total, label, width
        self.stream = stream if stream is not None else sys.stderr
        self.done, self.start, self._drawn = 0, time.monotonic(), -1.0
        self._tty = getattr(self.stream, "isatty", lambda: False)()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.done >= self.total or (self._tty and now - self._drawn >= 0.1):
            self._draw(now)

    def _draw(self, now: float) -> None:
        self._drawn = now
        frac = self.done / self.total if self.total else 1.0
        filled = int(frac * self.width)
        rate = self.done / max(now - self.start, 1e-9)
        line = (f"{self.label} [{'#' * filled}{'-' * (self.width - filled)}] "
                f"{self.done}/{self.total} {frac:4.0%} {rate:5.1f}/s")
        end = "\n" if self.done >= self.total else ""
        self.stream.write(("\r" if self._tty else "") + line + end)
        self.stream.flush()


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def served_model(url: str, api_key: str | None = None,
                 timeout_s: float = 30.0) -> tuple[str, str]:
    """The model id the proxy serves and llama-server's build: ``GET /v1/models`` ->
    ``data[0].id`` and ``x_llama_build`` ("" when not told)."""
    resp = httpx.get(url.rstrip("/") + "/v1/models", headers=_headers(api_key), timeout=timeout_s)
    if resp.status_code != 200:
        raise ReadError(f"GET /v1/models answered {resp.status_code}: {resp.text[:300]}")
    body = resp.json()
    return str(body["data"][0]["id"]), str(body.get("x_llama_build") or "")


def _reading(item: Item, body: dict[str, Any]) -> Reading:
    answer = body["answers"][item.qid]
    if item.kind == "noul":
        p_true = float(answer["noul"])
        probs: tuple[float, ...] = (p_true, 1.0 - p_true)
    else:
        probs = tuple(float(answer["probabilities"][name]) for name in item.names)
    mass = answer.get("x_label_mass")
    return Reading(item.kind, probs, item.gold, answer.get("x_prompt_format_version"),
                   answer.get("x_reads"), None if mass is None else float(mass),
                   tuple(tuple(float(p) for p in r["by_position"])
                         for r in answer.get("x_rotations") or ()),
                   answer.get("x_read_scheme"))


def _read_one(client: httpx.Client, item: Item, extra: dict[str, Any]) -> Reading:
    payload = {**item.body, **extra}
    for attempt in range(_ATTEMPTS):
        try:
            resp = client.post("/v1/systemone", json=payload)
        except httpx.TransportError as exc:
            if attempt + 1 == _ATTEMPTS:
                raise ReadError(f"{item.source}: proxy unreachable: {exc!r}") from exc
        else:
            if resp.status_code == 200:
                try:
                    return _reading(item, resp.json())
                except (KeyError, TypeError, ValueError) as exc:
                    raise ReadError(f"{item.source}: unexpected answer {resp.text[:300]}") from exc
            if resp.status_code not in _RETRY_STATUSES or attempt + 1 == _ATTEMPTS:
                raise ReadError(f"{item.source}: proxy answered {resp.status_code}: "
                                f"{resp.text[:300]}")
        time.sleep(0.5 * 2 ** attempt)
    raise AssertionError("unreachable")


def read_answers(
    items: Sequence[Item], url: str, *, api_key: str | None = None, debias: str | None = None,
    concurrency: int = 4, timeout_s: float = 120.0,
    progress: Callable[[int], None] | None = None,
) -> list[Reading]:
    """One reading per item, in item order; ``progress(1)`` is called after each."""
    extra: dict[str, Any] = {"x_calibration": "none"}
    if debias is not None:
        extra["x_debias"] = debias
    out: list[Reading | None] = [None] * len(items)
    with httpx.Client(base_url=url.rstrip("/"), headers=_headers(api_key),
                      timeout=timeout_s) as client, \
            ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = {pool.submit(_read_one, client, item, extra): i for i, item in enumerate(items)}
        try:
            for future in as_completed(futures):
                out[futures[future]] = future.result()
                if progress is not None:
                    progress(1)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return [r for r in out if r is not None]
