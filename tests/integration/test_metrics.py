"""/metrics after real traffic: counts and histogram totals match what was sent."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scripts.stack import stop
from tests.conftest import launch_proxy

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Ticket: my invoice is wrong."}]


@pytest.fixture(scope="module")
def fresh_proxy(llama, logs_dir):
    """A proxy of this module's own, so its counters start at zero."""
    proc, url, log = launch_proxy(logs_dir, llama.url)
    yield url
    stop(proc)
    log.close()


def _samples(url):
    text = httpx.get(url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_match_the_traffic(fresh_proxy):
    post = lambda path, body: httpx.post(fresh_proxy + path, json=body, timeout=60)  # noqa: E731
    for _ in range(3):
        assert (
            post(CHAT, {"messages": MESSAGES, "semif": {"options": ["a", "b", "c"]}}).status_code
            == 200
        )
    for _ in range(2):
        assert post(CHAT, {"messages": MESSAGES, "max_tokens": 2}).status_code == 200
    for _ in range(2):
        assert post(CHAT, {"messages": MESSAGES, "semif": {"options": ["only"]}}).status_code == 400
    questions = {
        "team": {"type": "choice", "criteria": {"w": None, "x": None, "y": None, "z": None}},
        "spam": {"type": "noul"},
    }
    assert post("/v1/systemone", {"state": "s", "questions": questions}).status_code == 200
    assert post("/v1/systemone", {"state": None, "questions": questions}).status_code == 422

    m = _samples(fresh_proxy)
    latency = "semif_request_duration_seconds_count"
    assert _get(m, latency, route=CHAT, kind="decision", outcome="ok") == 3
    assert _get(m, latency, route=CHAT, kind="relay", outcome="ok") == 2
    assert _get(m, latency, route=CHAT, kind="decision", outcome="client_error") == 2
    assert _get(m, latency, route="/v1/systemone", kind="decision", outcome="ok") == 1
    assert _get(m, latency, route="/v1/systemone", kind="decision", outcome="client_error") == 1
    # per request: questions; per question: options, label mass, confidence
    assert _get(m, "semif_questions_per_request_count") == 4
    assert _get(m, "semif_questions_per_request_sum") == 3 * 1 + 2
    assert _get(m, "semif_options_per_question_count") == 5
    assert _get(m, "semif_options_per_question_sum") == 3 * 3 + 4 + 2
    assert _get(m, "semif_label_mass_ratio_count") == 5
    assert _get(m, "semif_decision_confidence_ratio_count", type="choice") == 4
    assert _get(m, "semif_client_errors_total", reason="invalid_request") == 2
    assert _get(m, "semif_client_errors_total", reason="validation_error") == 1
    # upstream time is part of the decision's time, measured for each decision request
    for route, n in ((CHAT, 3), ("/v1/systemone", 1)):
        assert _get(m, "semif_decision_upstream_seconds_count", route=route) == n
        assert _get(m, "semif_decision_proxy_seconds_count", route=route) == n
        total = _get(
            m, "semif_request_duration_seconds_sum", route=route, kind="decision", outcome="ok"
        )
        upstream = _get(m, "semif_decision_upstream_seconds_sum", route=route)
        assert 0 < upstream < total
    assert _get(m, "semif_requests_in_flight", route=CHAT) == 0
    assert [_get(m, "semif_decisions_total", type=t) for t in ("choice", "noul", "score")] == [
        4,
        1,
        0,
    ]
    # the decision-time histograms exist for decision routes only
    routes = {
        dict(labels)["route"]
        for (name, labels) in m
        if name == "semif_decision_upstream_seconds_count"
    }
    assert routes == {CHAT, "/v1/systemone"}
    assert _get(m, "process_resident_memory_bytes") > 10e6 and _get(m, "process_open_fds") > 0
    assert _get(m, "semif_upstream_errors_total", kind="upstream_unavailable") == 0  # a series


def test_labels_stay_bounded(fresh_proxy):
    httpx.post(fresh_proxy + "/no/such/path/12345", json={})
    text = httpx.get(fresh_proxy + "/metrics").text
    assert "12345" not in text and "Ticket" not in text
    assert 'route="/{path}"' in text  # every relayed path under the catch-all's one label
