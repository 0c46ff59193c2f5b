"""Our lock-free histogram exposes exactly what prometheus_client's would."""

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import _Histogram

BUCKETS = (0.1, 0.5, 1, 5)
VALUES = [0.0, 0.1, 0.10000001, 0.5, 0.7, 1, 4.99, 5, 5.01, 1e9, -3, float("inf")]


def samples(registry: CollectorRegistry) -> list[tuple[str, dict, float]]:
    """Every sample but ``_created`` (which ours does not expose)."""
    text = generate_latest(registry).decode()
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value)
                  for family in text_string_to_metric_families(text) for s in family.samples
                  if not s.name.endswith("_created"))


@pytest.mark.parametrize("labels", [(), ("route", "kind")])
def test_same_exposition_as_prometheus_client(labels):
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = _Histogram("h_seconds", "doc", labels, buckets=BUCKETS, registry=ours)
    reference = Histogram("h_seconds", "doc", labels, buckets=BUCKETS, registry=theirs)
    for i, value in enumerate(VALUES):
        values = ("/a" if i % 2 else "/b", "decision") if labels else ()
        (mine.labels(*values) if labels else mine).observe(value)
        (reference.labels(*values) if labels else reference).observe(value)
    assert samples(ours) == samples(theirs)


def test_buckets_count_values_up_to_and_including_each_bound():
    registry = CollectorRegistry()
    h = _Histogram("h", "doc", buckets=BUCKETS, registry=registry)
    for value in (0.1, 0.5, 0.6, 7):
        h.observe(value)
    got = {dict(labels).get("le"): value for name, labels, value in samples(registry)
           if name == "h_bucket"}
    assert got == {"0.1": 1, "0.5": 2, "1.0": 3, "5.0": 3, "+Inf": 4}
    assert ("h_sum", (), 0.1 + 0.5 + 0.6 + 7) in samples(registry)


def test_label_count_is_checked():
    h = _Histogram("h", "doc", ("route",), buckets=BUCKETS, registry=CollectorRegistry())
    with pytest.raises(ValueError, match="takes labels"):
        h.labels("a", "b")


def test_nan_is_counted_in_no_bucket_like_prometheus_client():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = _Histogram("h", "doc", buckets=BUCKETS, registry=ours)
    reference = Histogram("h", "doc", buckets=BUCKETS, registry=theirs)
    for h in (mine, reference):
        h.observe(0.2)
        h.observe(float("nan"))
    counts = [[(n, l, v) for n, l, v in samples(r) if n != "h_sum"] for r in (ours, theirs)]
    assert counts[0] == counts[1] and ("h_count", (), 1.0) in counts[0]
