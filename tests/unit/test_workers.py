"""--workers: how the admission limits are split, and how the workers' metrics add up."""

from __future__ import annotations

import pytest

from proxy.metrics import Metrics, merged
from proxy.reader import worker_slots
from proxy.workers import share


@pytest.mark.parametrize(
    "total, workers, least, parts",
    [
        (16, 2, 1, [8, 8]),
        (16, 3, 1, [6, 5, 5]),
        (64, 3, 0, [22, 21, 21]),
        (1, 2, 1, [1, 1]),  # every worker can serve one decision at least
        (0, 2, 0, [0, 0]),  # no queue stays no queue
        (5, 1, 1, [5]),
    ],
)
def test_share_splits_a_limit_over_the_workers(total, workers, least, parts):
    assert [share(total, workers, i, least=least) for i in range(workers)] == parts


EXPOSITION_A = """\
# HELP semif_client_errors_total 4xx answers by reason
# TYPE semif_client_errors_total counter
semif_client_errors_total{reason="bad_body"} 2.0
# HELP semif_client_errors_created 4xx answers by reason
# TYPE semif_client_errors_created gauge
semif_client_errors_created{reason="bad_body"} 1700000100.0
# HELP semif_label_mass Raw probability mass the model gave the labels
# TYPE semif_label_mass histogram
semif_label_mass_bucket{le="0.5"} 1.0
semif_label_mass_bucket{le="+Inf"} 3.0
semif_label_mass_count 3.0
semif_label_mass_sum 2.25
# HELP semif_decisions_queued Decision requests waiting for an admission slot
# TYPE semif_decisions_queued gauge
semif_decisions_queued 4.0
"""

EXPOSITION_B = """\
# HELP semif_client_errors_total 4xx answers by reason
# TYPE semif_client_errors_total counter
semif_client_errors_total{reason="bad_body"} 5.0
semif_client_errors_total{reason="invalid_json"} 1.0
# HELP semif_client_errors_created 4xx answers by reason
# TYPE semif_client_errors_created gauge
semif_client_errors_created{reason="bad_body"} 1700000050.0
semif_client_errors_created{reason="invalid_json"} 1700000300.0
# HELP semif_label_mass Raw probability mass the model gave the labels
# TYPE semif_label_mass histogram
semif_label_mass_bucket{le="0.5"} 0.0
semif_label_mass_bucket{le="+Inf"} 2.0
semif_label_mass_count 2.0
semif_label_mass_sum 1.5
# HELP semif_decisions_queued Decision requests waiting for an admission slot
# TYPE semif_decisions_queued gauge
semif_decisions_queued 3.0
"""


def test_merged_sums_every_sample_and_keeps_the_earliest_created():
    assert (
        merged([EXPOSITION_A, EXPOSITION_B]).decode()
        == """\
# HELP semif_client_errors_total 4xx answers by reason
# TYPE semif_client_errors_total counter
semif_client_errors_total{reason="bad_body"} 7.0
semif_client_errors_total{reason="invalid_json"} 1.0
# HELP semif_client_errors_created 4xx answers by reason
# TYPE semif_client_errors_created gauge
semif_client_errors_created{reason="bad_body"} 1.70000005e+09
semif_client_errors_created{reason="invalid_json"} 1.7000003e+09
# HELP semif_label_mass Raw probability mass the model gave the labels
# TYPE semif_label_mass histogram
semif_label_mass_bucket{le="0.5"} 1.0
semif_label_mass_bucket{le="+Inf"} 5.0
semif_label_mass_count 5.0
semif_label_mass_sum 3.75
# HELP semif_decisions_queued Decision requests waiting for an admission slot
# TYPE semif_decisions_queued gauge
semif_decisions_queued 7.0
"""
    )


def test_one_workers_metrics_merged_alone_are_unchanged():
    metrics = Metrics()
    metrics.client_errors.labels("bad_body").inc(3)
    metrics.label_mass.observe(0.4)
    metrics.latency.labels("/v1/systemone", "decision", "ok").observe(0.012)
    metrics.watch(lambda: 2, lambda: 5)
    text = metrics.render()
    assert merged([text.decode()]) == text


def test_two_workers_count_as_two_processes():
    one, two = Metrics(), Metrics()
    total = merged([one.render().decode(), two.render().decode()]).decode()
    assert "\nsemif_worker_processes 2.0\n" in total


@pytest.mark.parametrize(
    "total, workers, slots",
    [
        (4, 1, [[0, 1, 2, 3]]),
        (4, 2, [[0, 2], [1, 3]]),
        (4, 3, [[0, 3], [1], [2]]),
        (2, 3, [[0], [1], [0]]),  # more workers than slots: the third shares slot 0
    ],
)
def test_workers_lease_disjoint_slots_while_there_are_enough(total, workers, slots):
    assert [worker_slots(total, i, workers) for i in range(workers)] == slots


async def test_a_scrape_while_a_worker_does_not_answer_is_503_not_a_partial_sum(tmp_path):
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from proxy.app_keys import METRICS, PEERS
    from proxy.middleware import MIDDLEWARES
    from proxy.routes.meta import metrics

    app = web.Application(middlewares=MIDDLEWARES)
    app[METRICS] = Metrics()
    app[PEERS] = (str(tmp_path / "worker-1.sock"),)  # nobody listens there
    app.router.add_get("/metrics", metrics)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/metrics")
        assert resp.status == 503 and resp.headers["Retry-After"] == "2"
        assert (await resp.json())["error"] == {  # OpenAI's shape, as every route's errors
            "message": "1 of 2 workers did not report their metrics; scrape again",
            "type": "server_error",
            "param": None,
            "code": "metrics_incomplete",
        }
