"""Every Prometheus collector, in one registry, under one prefix (``semif_``).

Labels stay bounded: routes are the registered paths (or ``other``), outcomes
and error kinds come from fixed sets; no option names, ids or model output.
Recorded by the middleware (requests) and the decision service (decisions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .decision.readout import Decision, choice_confidence, score_confidence
from .errors import UpstreamBadResponse, UpstreamError, UpstreamTimeout, UpstreamUnavailable

__all__ = [
    "Metrics",
    "CONTENT_TYPE",
    "after_reply",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST
# fine around a small model's decision (10-25 ms on a CPU), then coarse up to the deadline
_LATENCY = (
    0.002,
    0.005,
    0.0075,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    25,
    60,
)
_UNIT = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


def after_reply(record: Callable[..., None], *args: Any) -> None:
    """Run ``record(*args)`` when the current task next yields. A handler's answer is
    written in the same step that returns it, so recording then keeps the
    collectors' locks and bucket searches off the answer's latency."""
    asyncio.get_running_loop().call_soon(record, *args)


# every kind an upstream failure is counted under, exposed at 0 from the start
_UPSTREAM_KINDS = tuple(
    e.code for e in (UpstreamError, UpstreamUnavailable, UpstreamTimeout, UpstreamBadResponse)
)
_KINDS = ("choice", "score", "noul")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)  # process_*: memory, CPU, open files (Linux)
        r.register(PLATFORM_COLLECTOR)  # python_info
        self.latency = Histogram(
            "semif_request_duration_seconds",
            "Request latency by route, kind and outcome",
            ["route", "kind", "outcome"],
            buckets=_LATENCY,
            registry=r,
        )
        self.upstream_time = Histogram(
            "semif_decision_upstream_seconds",
            "Time a decision request spent waiting on llama-server",
            ["route"],
            buckets=_LATENCY,
            registry=r,
        )
        self.proxy_time = Histogram(
            "semif_decision_proxy_seconds",
            "Time a decision request spent in the proxy itself",
            ["route"],
            buckets=_LATENCY,
            registry=r,
        )
        self.in_flight = Gauge(
            "semif_requests_in_flight", "Requests being served", ["route"], registry=r
        )
        self.questions = Histogram(
            "semif_questions_per_request",
            "Questions in one decision request",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 400),
            registry=r,
        )
        self.options = Histogram(
            "semif_options_per_question",
            "Options of one question",
            buckets=(2, 3, 5, 10, 26, 64, 128, 255),
            registry=r,
        )
        self.label_mass = Histogram(
            "semif_label_mass_ratio",
            "Raw probability mass the model gave the labels",
            buckets=_UNIT,
            registry=r,
        )
        self.confidence = Histogram(
            "semif_decision_confidence_ratio",
            "Confidence of choice and score answers",
            ["type"],
            buckets=_UNIT,
            registry=r,
        )
        self.decisions = Counter(
            "semif_decisions", "Questions answered, by question type", ["type"], registry=r
        )
        self.wide_reads = Counter(
            "semif_wide_reads", "Readouts that needed a wider read to know every label", registry=r
        )
        self.upstream_errors = Counter(
            "semif_upstream_errors", "llama-server failures by kind", ["kind"], registry=r
        )
        self.client_errors = Counter(
            "semif_client_errors", "4xx answers by reason (overloaded: 429)", ["reason"], registry=r
        )
        for kind in _UPSTREAM_KINDS:  # a series at 0 from the start, not "No data"
            self.upstream_errors.labels(kind)
        self.client_errors.labels("overloaded")
        self._decided = {kind: self.decisions.labels(kind) for kind in _KINDS}
        self.unrepeatable_reads = Counter(
            "semif_unrepeatable_reads",
            "Reads whose llama-server slot changed under them (a replay may differ)",
            registry=r,
        )
        self.repeatable = Gauge(
            "semif_read_repeatable",
            "1 when the self-check's reads of a known prompt agreed bit for bit, 0 when not",
            ["model"],
            registry=r,
        )
        self.decisions_active = Gauge(
            "semif_decisions_active", "Decision requests holding an admission place", registry=r
        )
        self.decisions_queued = Gauge(
            "semif_decisions_queued", "Decision requests waiting for an admission place", registry=r
        )
        self.rerank_documents = Histogram(
            "semif_rerank_documents",
            "Documents in one rerank request",
            ["method"],
            buckets=(1, 2, 5, 10, 20, 50, 100, 255, 1000),
            registry=r,
        )
        self.rerank_seconds = Histogram(
            "semif_rerank_seconds_per_document",
            "A rerank request's latency per document",
            ["method"],
            buckets=_LATENCY,
            registry=r,
        )
        self.records_written = Counter(
            "semif_decision_records_written",
            "Decision records handed to their sink (--decision-records; answer: put in answers)",
            registry=r,
        )
        self.records_dropped = Counter(
            "semif_decision_records_dropped",
            "Decision records dropped: the queue was full or the sink failed (logged)",
            registry=r,
        )
        self.request_ids_replaced = Counter(
            "semif_request_ids_replaced",
            "Request id headers refused and replaced by a new id, by header (inference_id: "
            "X-Amzn-SageMaker-Inference-Id, request_id: X-Request-Id)",
            ["header"],
            registry=r,
        )
        for header in ("inference_id", "request_id"):
            self.request_ids_replaced.labels(header)

        self._route: dict[str, tuple[Any, Any]] = {}
        self._latency: dict[tuple[str, str, str], Any] = {}
        self._confidence: dict[str, Any] = {}
        self._active: dict[str, int] = {}  # in flight by route, read by the gauge at scrape time

    # Label lookups are cached: each costs a lock and a dict walk per call.

    def request_started(self, route: str) -> None:
        """On the answer's path: a plain count, no lock (the gauge reads it when scraped)."""
        active = self._active
        if route in active:
            active[route] += 1
        else:
            active[route] = 1
            self.in_flight.labels(route).set_function(lambda: active[route])

    def request_finished(
        self, route: str, kind: str, status: int, elapsed_s: float, upstream_s: float
    ) -> None:
        self._active[route] -= 1
        outcome = (
            "ok"
            if status < 400
            else "client_error"
            if status < 500
            else "server_error"
            if status == 500
            else "upstream_error"
        )
        key = (route, kind, outcome)
        latency = self._latency.get(key)
        if latency is None:  # routes, kinds and outcomes are fixed sets: bounded
            latency = self._latency[key] = self.latency.labels(*key)
        latency.observe(elapsed_s)
        if kind == "decision" and status < 400:  # decision routes only: no all-zero series
            children = self._route.get(route)
            if children is None:
                children = self._route[route] = (
                    self.upstream_time.labels(route),
                    self.proxy_time.labels(route),
                )
            children[0].observe(upstream_s)
            children[1].observe(max(0.0, elapsed_s - upstream_s))

    def decision(self, decision: Decision, reads: int) -> None:
        probs = decision.probabilities
        self.options.observe(len(probs))
        self.label_mass.observe(decision.label_mass)
        kind = decision.question.kind
        self._decided[kind].inc()
        if kind in ("choice", "score"):
            child = self._confidence.get(kind)
            if child is None:
                child = self._confidence[kind] = self.confidence.labels(kind)
            formula = choice_confidence if kind == "choice" else score_confidence
            child.observe(formula(probs))
        if reads > 1:
            self.wide_reads.inc()

    def watch(self, active: Callable[[], float], queued: Callable[[], float]) -> None:
        """Read the admission's counts when scraped."""
        self.decisions_active.set_function(active)
        self.decisions_queued.set_function(queued)

    def render(self) -> bytes:
        return generate_latest(self.registry)
