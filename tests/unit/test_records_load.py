"""semif_tools/record_files.py and files.py: records read from files and from folders as
``aws s3 sync`` leaves them, one record per decision id (the last of repeats kept, records
that differ left out, both counted, nothing aborted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semif_tools.files import data_files
from semif_tools.record_files import load_records, parse_record, unique_records
from tests.unit.test_outcomes import HASH, record

OTHER = "hmac-sha256:" + "cd" * 32


def _parsed(rows):
    return [parse_record(record(d, **over), f"r:{n}") for n, (d, over) in enumerate(rows, 1)]


@pytest.mark.parametrize(
    ("rows", "kept", "counts", "summary"),
    [
        ([("a", {}), ("b", {})], ["r:1", "r:2"], (2, 0, 0), ""),
        (
            # a retry: the last read is kept, in its place
            [("a", {"latency_ms": 1}), ("b", {}), ("a", {"latency_ms": 2})],
            ["r:2", "r:3"],
            (3, 1, 0),
            "1 records repeat a decision id read again later (the last of each kept)",
        ),
        (
            [("a", {}), ("a", {}), ("a", {})],
            ["r:3"],
            (3, 2, 0),
            "2 records repeat a decision id read again later (the last of each kept)",
        ),
        (
            # one id, two prompts: neither is the decision an outcome of that id labels
            [("a", {}), ("b", {}), ("a", {"prompt_hash": OTHER})],
            ["r:2"],
            (3, 0, 2),
            "1 decision ids name records that differ in prompt_hash or options: their 2 "
            "records left out (first: 'a' at r:3)",
        ),
        (
            [("a", {}), ("a", {}), ("a", {"options": ["billing", "returns"]}), ("c", {})],
            ["r:4"],
            (4, 0, 3),
            "1 decision ids name records that differ in prompt_hash or options: their 3 "
            "records left out (first: 'a' at r:3)",
        ),
        (
            [("a", {"prompt_hash": None}), ("a", {}), ("b", {}), ("b", {})],
            ["r:4"],
            (4, 1, 2),
            "1 records repeat a decision id read again later (the last of each kept); 1 "
            "decision ids name records that differ in prompt_hash or options: their 2 records "
            "left out (first: 'a' at r:2)",
        ),
    ],
)
def test_one_record_per_decision_id(rows, kept, counts, summary):
    loaded = unique_records(_parsed(rows))
    assert [r.source for r in loaded.records] == kept
    assert (loaded.read, loaded.repeated, loaded.conflicting) == counts
    assert loaded.summary() == summary


def _write(path: Path, ids: list[str], **over) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record(d, **over)) + "\n" for d in ids), encoding="utf-8")
    return path


def test_a_synced_folder_is_read_recursively_in_date_order(tmp_path):
    """``aws s3 sync s3://bucket/records/ records/`` leaves yyyy/mm/dd/hh folders: read in
    path order, which is date order, so the last of a retried id is the latest."""
    root = tmp_path / "records"
    late = _write(root / "2026/12/03/10/b.jsonl", ["r-2", "r-3"], latency_ms=2)
    early = _write(root / "2026/12/03/09/z.jsonl", ["r-1", "r-2"], latency_ms=1)
    first = _write(root / "2026/11/30/23/a.jsonl", ["r-0"])
    (root / "2026/12/03/10/notes.txt").write_text("not a record file")
    (root / "2026/12/03/10/empty.jsonl").mkdir()  # a folder that only looks like a file
    alone = _write(tmp_path / "extra.jsonl", ["r-9"])
    assert data_files([root, alone]) == [first, early, late, alone]
    loaded = load_records([root, alone])
    assert [(r.decision_id, r.source) for r in loaded.records] == [
        ("r-0", f"{first}:1"),
        ("r-1", f"{early}:1"),
        ("r-2", f"{late}:1"),  # the later of the two: 10 h, not 09 h
        ("r-3", f"{late}:2"),
        ("r-9", f"{alone}:1"),
    ]
    assert loaded.repeated == 1 and loaded.records[2].fields["latency_ms"] == 2


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("missing", FileNotFoundError, "missing: no such file or folder"),
        ("empty", FileNotFoundError, r"empty: no \*\.jsonl file in this folder or under it"),
        ("s3://bucket/records/", ValueError, "s3:// URIs are not read directly"),
    ],
)
def test_what_cannot_be_read_is_refused(tmp_path, name, error, message):
    (tmp_path / "empty" / "2026").mkdir(parents=True)
    path = name if name.startswith("s3:") else tmp_path / name
    with pytest.raises(error, match=message):
        load_records([path])


def test_the_records_hash_is_compared_as_recorded():
    """Two retries answered by instances with different keys differ in prompt_hash: until
    the deployment shares one key file they are two decisions to the load (left out)."""
    loaded = unique_records(_parsed([("a", {"prompt_hash": HASH}), ("a", {"prompt_hash": OTHER})]))
    assert (loaded.records, loaded.conflicting_ids) == ([], ["a"])


def test_records_an_older_proxy_wrote_in_other_words_still_load(tmp_path):
    """The wording version and the route's reason are open strings to the reader: a file
    written before a rewording (another prompt format, a reason in a sentence) still loads;
    what the record means (types, probabilities per option) is still checked."""
    old = {"prompt_format_version": "semif-0", "route": "review"}
    old["route_reason"] = "label mass 0.21 is below the floor 0.3"
    path = _write(tmp_path / "old.jsonl", ["r-1"], **old)
    (loaded,) = load_records([path]).records
    assert (loaded.fields["prompt_format_version"], loaded.fields["route_reason"]) == (
        "semif-0",
        old["route_reason"],
    )
    _write(path, ["r-1"], **old, label_mass="high")
    with pytest.raises(ValueError, match="label_mass"):
        load_records([path])
