"""semif_tools/outcomes.py: outcomes written in CSV (the encoding AWS documents for ground
truth) and read in CSV or JSON, AWS's own ground-truth record read as AWS prints it, and the
join by any of a decision's keys (its decision id, the capture's inferenceId or eventId)."""

from __future__ import annotations

import json

import pytest

from semif_tools.outcomes import (
    Outcome,
    csv_field,
    join,
    load_outcomes,
    outcome_line,
    parse_outcome,
    write_outcomes,
)
from semif_tools.record_files import RecordError, join_keys, parse_record
from tests.data.aws_samples import AWS_GROUND_TRUTH

HASH = "hmac-sha256:" + "ab" * 32


def record(decision_id, options=("billing", "shipping"), capture=None, **over):
    """A record as the proxy writes it (``over``: the fields a test is about)."""
    n = len(options)
    data = {
        "record": "semif.decision/1",
        "decision_id": decision_id,
        "request_id": decision_id.partition("/")[0],
        "question_id": None,
        "time": "2026-12-03T10:11:12.345Z",
        "api": "system_one",
        "model": "m.gguf",
        "llama_build": "b1",
        "prompt_format_version": "semif-3",
        "layout": "conversation_first",
        "read_scheme": "segment",
        "prompt_tokens": 12,
        "prompt_hash": HASH,
        "question_type": "choice",
        "options": list(options),
        "raw_probabilities": [1 / n] * n,
        "probabilities": [1 / n] * n,
        "choice": options[0],
        "confidence": 0.0,
        "label_mass": 1.0,
        "profile": None,
        "calibration_method": None,
        "threshold": None,
        "route": None,
        "route_reason": None,
        "debias": None,
        "repeatable": None,
        "latency_ms": 1.0,
        **over,
    }
    if capture is not None:
        data["capture"] = capture
    return data


# -- CSV -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "field"),
    [
        ("billing", "billing"),
        ("a, b", '"a, b"'),
        ('say "hi"', '"say ""hi"""'),
        ("two\nlines", '"two\nlines"'),
        ("cr\r\nlf", '"cr\r\nlf"'),
        ("\r", '"\r"'),
        (" padded ", " padded "),
        ("1", "1"),
        ("é, ü", '"é, ü"'),
    ],
)
def test_an_option_is_one_csv_field_that_reads_back_whole(option, field):
    assert csv_field(option) == field
    line = outcome_line("d-1", option)
    assert line == {
        "groundTruthData": {"data": field, "encoding": "CSV"},
        "eventMetadata": {"eventId": "d-1"},
        "eventVersion": "0",
    }
    assert parse_outcome(json.loads(json.dumps(line))).label == option


def test_outcomes_round_trip_through_a_file(tmp_path):
    options = ["billing", "a, b", 'say "hi"', "two\nlines", "cr\r\nlf", "é"]
    path = tmp_path / "o.jsonl"
    labels = [(f"d-{i}", o) for i, o in enumerate(options)]
    assert write_outcomes(path, labels) == len(options)
    assert len(path.read_text(encoding="utf-8").splitlines()) == len(options)  # one a line
    got = load_outcomes([path])
    assert [(o.key, o.label) for o in got] == labels
    assert [o.source for o in got] == [f"{path}:{n}" for n in range(1, len(options) + 1)]


@pytest.mark.parametrize(
    ("ground", "label"),
    [
        ({"data": "billing", "encoding": "CSV"}, "billing"),
        ({"data": '"a, b"', "encoding": "CSV"}, "a, b"),
        ({"data": '"a, b"', "encoding": "JSON"}, "a, b"),  # JSON still read
        ({"data": "true", "encoding": "JSON"}, True),
        ({"data": "2", "encoding": "JSON"}, 2),
    ],
)
def test_both_encodings_are_read(ground, label):
    line = {"groundTruthData": ground, "eventMetadata": {"eventId": "d"}, "eventVersion": "0"}
    assert parse_outcome(line) == Outcome("<outcome>", "d", label)


def test_awss_ground_truth_record_is_read_and_joins_by_the_captures_event_id(tmp_path):
    """AWS's sample, as its page prints it, joins the record whose capture has that eventId
    (a yes/no question asked through /invocations; its label "1" names option "1")."""
    outcome = parse_outcome(json.loads(AWS_GROUND_TRUTH), "aws")
    assert outcome == Outcome("aws", "aaaa-bbbb-cccc", "1")
    path = tmp_path / "gt.jsonl"  # as Model Monitor reads it: one JSON line
    path.write_text(json.dumps(json.loads(AWS_GROUND_TRUTH)) + "\n", encoding="utf-8")
    assert [(o.key, o.label) for o in load_outcomes([path])] == [("aaaa-bbbb-cccc", "1")]
    captured = {"event_id": "aaaa-bbbb-cccc", "inference_id": None, "inference_time": None}
    rec = parse_record(record("0f3e", ("0", "1"), captured, question_type="score"), "r:1")
    joined = join([rec], [outcome])
    assert [(r.decision_id, gold) for r, gold in joined.pairs] == [("0f3e", 1)]


# -- the keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decision_id", "capture", "keys"),
    [
        ("r1", None, ("r1",)),  # written by the proxy itself: its decision id only
        ("r1", {"event_id": "e1", "inference_id": "r1"}, ("r1", "e1")),
        ("r1/team", {"event_id": "e1", "inference_id": "r1"}, ("r1/team", "e1/team")),
        # an InferenceId with "/" and a space: escaped in the decision id, as given in the key
        (
            "t 7%2Fa/team",
            {"event_id": "e2", "inference_id": "t 7/a"},
            ("t 7%2Fa/team", "t 7/a/team", "e2/team"),
        ),
        ("b1/2/tone", {"event_id": "e3", "inference_id": None}, ("b1/2/tone", "e3/2/tone")),
        ("b1/0", {"event_id": "e3"}, ("b1/0", "e3/0")),
        # the InferenceId did not reach the proxy: the decision id is its own uuid
        ("9a7c", {"event_id": "e4", "inference_id": "inf-4"}, ("9a7c", "inf-4", "e4")),
        ("x", {"event_id": "", "inference_id": 5}, ("x",)),
    ],
)
def test_join_keys(decision_id, capture, keys):
    assert join_keys(decision_id, capture) == keys


def _outcome(key, label, n):
    return parse_outcome(
        {"groundTruthData": {"data": label, "encoding": "CSV"}, "eventMetadata": {"eventId": key}},
        f"o:{n}",
    )


def test_outcomes_join_by_any_key():
    cap = {"event_id": "ev-1", "inference_id": "inf 1/x", "inference_time": None}
    records = [
        parse_record(record("inf 1%2Fx/team", capture=cap), "r:1"),
        parse_record(record("inf 1%2Fx/kind", ("a", "b"), cap), "r:2"),
        parse_record(record("9a7c", capture={"event_id": "ev-2", "inference_id": "t-9"}), "r:3"),
        parse_record(record("9a7d", capture={"event_id": "ev-3", "inference_id": "t-9"}), "r:4"),
        parse_record(record("d-5"), "r:5"),
        parse_record(record("d-6", capture={"event_id": "ev-6"}), "r:6"),
    ]
    keyed = [
        ("inf 1/x/team", "shipping"),  # the InferenceId as given, with the question
        ("ev-1/kind", "b"),  # the eventId, with the question
        ("ev-1", "a"),  # an invocation of two decisions: the eventId alone names neither
        ("t-9", "billing"),  # a retry whose InferenceId did not reach the proxy: two records
        ("d-5", "billing"),  # the decision id
        ("ev-6", "shipping"),
        ("d-6", "billing"),  # d-6 again, by another key: the first outcome stands
    ]
    joined = join(records, [_outcome(k, label, n) for n, (k, label) in enumerate(keyed, 1)])
    assert [(r.decision_id, gold) for r, gold in joined.pairs] == [
        ("inf 1%2Fx/team", 1),
        ("inf 1%2Fx/kind", 1),
        ("d-5", 0),
        ("d-6", 1),
    ]
    assert joined.summary() == (
        "4 of 6 records joined to an outcome; 2 records have none; 1 of 7 outcomes name no "
        "record (first: o:3); 0 outcomes name an option their record does not have; 1 outcomes "
        "name a key that several records have, left out (first: o:4, 't-9'); 1 outcomes name a "
        "record another outcome named first, left out (first: o:7)"
    )


def test_one_key_labelled_twice_is_refused(tmp_path):
    path = tmp_path / "o.jsonl"
    write_outcomes(path, [("d-1", "billing"), ("d-2", "billing"), ("d-1", "shipping")])
    with pytest.raises(RecordError, match=r"o.jsonl:3: 'd-1' again \(its outcome is first at "):
        load_outcomes([path])
