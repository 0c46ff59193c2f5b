"""The histograms' names, labels and buckets (what dashboards and alerts are written
against)."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import Metrics

LATENCY = (
    "0.002",
    "0.005",
    "0.0075",
    "0.01",
    "0.0125",
    "0.015",
    "0.02",
    "0.025",
    "0.05",
    "0.1",
    "0.25",
    "0.5",
    "1.0",
    "2.5",
    "5.0",
    "10.0",
    "25.0",
    "60.0",
)
UNIT = (
    "0.05",
    "0.1",
    "0.2",
    "0.3",
    "0.4",
    "0.5",
    "0.6",
    "0.7",
    "0.8",
    "0.9",
    "0.95",
    "0.99",
    "1.0",
)
COUNTS = ("1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "400.0")
OPTIONS = ("2.0", "3.0", "5.0", "10.0", "26.0", "64.0", "128.0", "255.0")
DOCUMENTS = ("1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "255.0", "1000.0")


def _buckets(text: str, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A histogram's label names (but ``le``, in the exposition's order: sorted) and bucket
    bounds (but +Inf) as exposed."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            assert family.type == "histogram"
            buckets = [s for s in family.samples if s.name == name + "_bucket"]
            labels = tuple(k for k in buckets[0].labels if k != "le")
            return labels, tuple(s.labels["le"] for s in buckets if s.labels["le"] != "+Inf")
    raise AssertionError(f"{name} not exposed")


@pytest.mark.parametrize(
    ("attribute", "name", "labels", "bounds"),
    [
        ("latency", "semif_request_duration_seconds", ("route", "kind", "outcome"), LATENCY),
        ("upstream_time", "semif_decision_upstream_seconds", ("route",), LATENCY),
        ("proxy_time", "semif_decision_proxy_seconds", ("route",), LATENCY),
        ("questions", "semif_questions_per_request", (), COUNTS),
        ("options", "semif_options_per_question", (), OPTIONS),
        ("label_mass", "semif_label_mass_ratio", (), UNIT),
        ("confidence", "semif_decision_confidence_ratio", ("type",), UNIT),
        ("rerank_documents", "semif_rerank_documents", ("method",), DOCUMENTS),
        ("rerank_seconds", "semif_rerank_seconds_per_document", ("method",), LATENCY),
    ],
)
def test_names_labels_and_buckets(attribute, name, labels, bounds):
    metrics = Metrics()
    histogram = getattr(metrics, attribute)
    (histogram.labels(*("x" for _ in labels)) if labels else histogram).observe(0.5)
    assert _buckets(metrics.render().decode(), name) == (tuple(sorted(labels)), bounds)
