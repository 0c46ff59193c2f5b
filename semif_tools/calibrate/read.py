"""Reading labelled items through a running proxy: the only module of the package that
speaks HTTP, through the tools' client and retry policy (``semif_tools/client.py``).

System One items go to ``POST /v1/systemone`` as they are, plus
``"x_calibration": "none"`` (so no profile is applied) and, for debiased reads,
``"x_debias": "cyclic"`` or ``"contextual"``. The answer's ``probabilities`` (choice,
score) or ``noul``, its label mass and, for cyclic reads, each rotation's
probabilities by position become one ``Reading``. Rerank items go to
``POST /v1/rerank``, one query per request; the model comes from ``GET /v1/models``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import httpx

from ..client import client, send
from .dataset import Item
from .fit import Labelled
from .rerank_fit import RerankItem

__all__ = ["AnswerError", "Reading", "served_model", "read_answers", "read_rerank_scores"]

Progress = Callable[[int], object]  # called with 1 after each item: a Bar's update


class AnswerError(RuntimeError):
    """The proxy could not answer an item (after the retry policy); the message names the
    item and the status."""


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
    decision_id: str | None = None  # x_decision_id: the decision's record, when records are on

    @property
    def labelled(self) -> Labelled:
        return Labelled(self.kind, self.probabilities, self.gold, self.label_mass)


def _answered(
    what: str, http: httpx.Client, method: str, path: str, **kwargs: Any
) -> httpx.Response:
    """The 200 answer to a request (through the retry policy), or AnswerError naming ``what``."""
    try:
        resp = send(http, method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise AnswerError(f"{what}: the proxy did not answer: {exc!r}") from exc
    if resp.status_code != 200:
        raise AnswerError(f"{what}: the proxy answered {resp.status_code}: {resp.text[:300]}")
    return resp


def served_model(url: str, api_key: str | None = None, timeout_s: float = 30.0) -> tuple[str, str]:
    """The model id the proxy serves and llama-server's build: ``GET /v1/models`` ->
    ``data[0].id`` and ``x_llama_build`` ("" when not told)."""
    with client(url, api_key=api_key, timeout_s=timeout_s) as http:
        resp = _answered("GET /v1/models", http, "GET", "/v1/models")
    try:
        body = resp.json()
        return str(body["data"][0]["id"]), str(body.get("x_llama_build") or "")
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise AnswerError(f"GET /v1/models: unexpected answer {resp.text[:300]}") from exc


def _reading(item: Item, body: dict[str, Any]) -> Reading:
    answer = body["answers"][item.qid]
    if item.kind == "noul":
        p_true = float(answer["noul"])
        probs: tuple[float, ...] = (p_true, 1.0 - p_true)
    else:
        probs = tuple(float(answer["probabilities"][name]) for name in item.names)
    mass = answer.get("x_label_mass")
    return Reading(
        item.kind,
        probs,
        item.gold,
        answer.get("x_prompt_format_version"),
        answer.get("x_reads"),
        None if mass is None else float(mass),
        tuple(tuple(float(p) for p in r["by_position"]) for r in answer.get("x_rotations") or ()),
        answer.get("x_read_scheme"),
        answer.get("x_decision_id"),
    )


def _read_one(http: httpx.Client, item: Item, extra: dict[str, Any]) -> Reading:
    payload = {**item.body, **extra}
    resp = _answered(item.source, http, "POST", "/v1/systemone", json=payload)
    try:
        return _reading(item, resp.json())
    except (KeyError, TypeError, ValueError) as exc:
        raise AnswerError(f"{item.source}: unexpected answer {resp.text[:300]}") from exc


def read_answers(
    items: Sequence[Item],
    url: str,
    *,
    api_key: str | None = None,
    debias: str | None = None,
    concurrency: int = 4,
    timeout_s: float = 120.0,
    progress: Progress | None = None,
) -> list[Reading]:
    """One reading per item, in item order; ``progress(1)`` is called after each."""
    extra: dict[str, Any] = {"x_calibration": "none"}
    if debias is not None:
        extra["x_debias"] = debias
    out: list[Reading | None] = [None] * len(items)
    with (
        client(url, api_key=api_key, timeout_s=timeout_s) as http,
        ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool,
    ):
        futures = {pool.submit(_read_one, http, item, extra): i for i, item in enumerate(items)}
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


def read_rerank_scores(
    items: Sequence[RerankItem],
    url: str,
    *,
    api_key: str | None = None,
    timeout_s: float = 300.0,
    progress: Progress | None = None,
) -> tuple[list[list[float]], str]:
    """Each query's pointwise scores (uncalibrated), by document index, and the prompt
    format they were read with; one request per query, one at a time (each request
    already reads its documents over the slot that holds the query)."""
    out, version = [], ""
    with client(url, api_key=api_key, timeout_s=timeout_s) as http:
        for item in items:
            resp = _answered(
                item.source,
                http,
                "POST",
                "/v1/rerank",
                json={"query": item.query, "documents": list(item.documents)},
            )
            try:
                answer = resp.json()
                scores = [0.0] * len(item.documents)
                for result in answer["results"]:
                    scores[result["index"]] = float(result["relevance_score"])
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise AnswerError(f"{item.source}: unexpected answer {resp.text[:300]}") from exc
            out.append(scores)
            version = answer.get("x_prompt_format_version") or version
            if progress is not None:
                progress(1)
    return out, version
