"""The outcome loop on what SageMaker's Data Capture writes, on the real proxy and
llama-server (``--decision-records answer``); the requests, the capture and the checks are
tests/capture_round.py's, which the container suite runs against the single image too."""

from __future__ import annotations

import pytest

from scripts.stack import stop
from tests.capture_round import (
    assert_every_decision_recovered,
    assert_keyed_alike,
    records_from_capture,
    serve_and_capture,
)
from tests.conftest import launch_proxy


@pytest.fixture(scope="module")
def captured(llama, logs_dir, tmp_path_factory):
    """The folder holding the capture, and each labelled decision's three keys and label."""
    out = tmp_path_factory.mktemp("capture")
    proc, url, log = launch_proxy(logs_dir, llama.url, "--decision-records", "answer")
    try:
        labels = serve_and_capture(url, out)
    finally:
        stop(proc)
        log.close()
    return out, labels


@pytest.fixture(scope="module")
def records(captured):
    return records_from_capture(captured[0])


def test_every_decision_is_recovered_from_the_capture_the_retry_once(captured, records):
    assert_every_decision_recovered(captured[1], records)


@pytest.mark.parametrize("key", [1, 2], ids=["inferenceId", "eventId"])
def test_outcomes_keyed_the_aws_way_give_the_profile_and_drift_of_decision_ids(
    captured, records, key, capfd
):
    out, labels = captured
    assert_keyed_alike(out, records, labels, key, capfd)
