"""The production loop end to end, on the real proxy and llama-server: a labelled set served
once with decision records on, its labels attached as outcomes, a profile fitted both ways
(re-reading the requests, and from the records without reading anything again) and the two
compared; then the drift report over the same records."""

import json
from pathlib import Path

import pytest

from scripts.stack import stop
from semif_tools.__main__ import main as tools_main
from semif_tools.calibrate.cli import main as calibrate
from tests.conftest import launch_proxy

DATA = Path(__file__).resolve().parents[1] / "data"
PER_SET = 14  # 42 items: enough for the three-way split of each question type


@pytest.fixture(scope="module")
def recorded(llama, logs_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("loop")
    records = out / "records.jsonl"
    proc, url, log = launch_proxy(logs_dir, llama.url, "--decision-records", str(records))
    subset = out / "subset.jsonl"
    lines = []
    for name in ("tickets.jsonl", "sentiment.jsonl", "yesno.jsonl"):
        lines += (DATA / name).read_text(encoding="utf-8").splitlines()[:PER_SET]
    subset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        rc = calibrate(
            [
                str(subset),
                "--profile",
                "reread",
                "--url",
                url,
                "--out-dir",
                str(out),
                "--seed",
                "3",
                "--write-outcomes",
                str(out / "outcomes.jsonl"),
            ]
        )
        assert rc == 0
    finally:
        stop(proc)  # writes what is queued before it exits
        log.close()
    return out, records


def test_every_decision_served_left_a_record_and_outcomes_name_them(recorded):
    out, records = recorded
    lines = [json.loads(line) for line in records.read_text(encoding="utf-8").splitlines()]
    outcomes = [json.loads(line) for line in (out / "outcomes.jsonl").read_text().splitlines()]
    assert len(outcomes) == 3 * PER_SET
    ids = {r["decision_id"] for r in lines}
    assert all(o["eventMetadata"]["eventId"] in ids for o in outcomes)
    assert all("input" not in r for r in lines)  # no inputs unless asked for


def test_the_fit_from_records_is_the_re_reading_fit(recorded, capfd):
    out, records = recorded
    rc = calibrate(
        [
            "--records",
            str(records),
            "--outcomes",
            str(out / "outcomes.jsonl"),
            "--profile",
            "fromrecords",
            "--out-dir",
            str(out),
            "--seed",
            "3",
        ]
    )
    assert rc == 0, capfd.readouterr().err
    reread = json.loads((out / "reread.json").read_text())
    fitted = json.loads((out / "fromrecords.json").read_text())
    # what differs by construction: the name, when it was made and what it was made from
    for profile in (reread, fitted):
        for key in ("name", "created", "data_sha256"):
            profile.pop(key, None)
    assert fitted == reread


def test_the_drift_report_reads_the_same_records(recorded):
    out, records = recorded
    page = out / "drift.html"
    table = out / "drift.json"
    rc = tools_main(
        [
            "drift",
            "--records",
            str(records),
            "--outcomes",
            str(out / "outcomes.jsonl"),
            "--profile",
            str(out / "reread.json"),
            "--out",
            str(page),
            "--json",
            str(table),
        ]
    )
    assert rc in (0, None)
    assert page.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")
    windows = json.loads(table.read_text())
    assert sum(w["n"] for w in windows["windows"]) >= 3 * PER_SET
