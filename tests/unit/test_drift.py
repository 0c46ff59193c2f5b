"""The drift report (semif_tools/drift.py, drift_page.py, drift_cli.py): exact figures per
window."""

import datetime as dt
import json
import math
from dataclasses import replace

import pytest

from proxy.calibration.profile import KindCalibration, Profile, Threshold
from semif_tools.calibrate.stats import wilson_interval
from semif_tools.drift import (
    PSI_FLOOR,
    decisions,
    drift_table,
    histogram,
    parse_window,
    psi,
)
from semif_tools.drift_cli import main
from semif_tools.outcomes import join, load_outcomes
from semif_tools.record_files import load_records

EXACT = {"rel": 1e-12, "abs": 1e-15}
DAY = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _record(i, when, mass):
    probs = [0.9, 0.05, 0.05]
    return {
        "record": "semif.decision/1",
        "decision_id": f"d{i}",
        "request_id": f"d{i}",
        "question_id": None,
        "time": when.isoformat().replace("+00:00", "Z"),
        "api": "decisions",
        "model": "m.gguf",
        "llama_build": "b1",
        "prompt_format_version": "semif-3",
        "layout": "conversation_first",
        "read_scheme": "prefix-63",
        "prompt_tokens": 50,
        "prompt_hash": None,
        "question_type": "choice",
        "options": ["a", "b", "c"],
        "raw_probabilities": probs,
        "probabilities": probs,
        "choice": "a",
        "confidence": 0.9,
        "label_mass": mass,
        "profile": "p",
        "calibration_method": "none",
        "threshold": 0.8,
        "route": "auto",
        "route_reason": "above_threshold",
        "debias": None,
        "repeatable": True,
        "latency_ms": 3.0,
    }


def _synthetic(tmp_path):
    """Two UTC days of 100 decisions each, every one 'a' at 0.9: right 90 times on the first
    day, 50 on the second; the label mass falls from 0.95 to 0.65; 20 more decisions on the
    second day have no outcome."""
    records, outcomes = [], []
    for day in range(2):
        for j in range(120 if day else 100):
            i = day * 1000 + j
            when = DAY + dt.timedelta(days=day, minutes=10 * j)
            records.append(_record(i, when, 0.65 if day else 0.95))
            if j < 100:
                right = j < (50 if day else 90)
                outcomes.append(
                    {
                        "groundTruthData": {"data": "a" if right else "b", "encoding": "CSV"},
                        "eventMetadata": {"eventId": f"d{i}"},
                        "eventVersion": "0",
                    }
                )
    rec, out = tmp_path / "r.jsonl", tmp_path / "o.jsonl"
    rec.write_text("".join(json.dumps(r) + "\n" for r in records[::-1]), encoding="utf-8")
    out.write_text("".join(json.dumps(o) + "\n" for o in outcomes), encoding="utf-8")
    return rec, out


def _table(rec, out, profile=None, resamples=200):
    records = load_records([rec]).records
    golds = {r.decision_id: g for r, g in join(records, load_outcomes([out])).pairs}
    return drift_table(
        decisions(records, golds, profile), parse_window("1d"), profile=profile, resamples=resamples
    )


def test_the_report_shows_the_accuracy_drop(tmp_path):
    drift = _table(*_synthetic(tmp_path))
    first, second = drift.windows
    assert (first.start, second.start, second.end) == (
        DAY,
        DAY + dt.timedelta(days=1),
        DAY + dt.timedelta(days=2),
    )
    assert [(w.n, w.labelled, w.routed) for w in drift.windows] == [
        (100, 100, 100),
        (120, 100, 120),
    ]
    assert first.accuracy == wilson_interval(90, 100) and second.accuracy == wilson_interval(
        50, 100
    )
    assert second.accuracy.high < first.accuracy.low  # the drop is outside both intervals
    assert first.ece.value == pytest.approx(0.0, abs=1e-12)
    assert second.ece.value == pytest.approx(0.4, **EXACT)
    assert second.ece.low > first.ece.high
    assert (first.coverage.value, second.coverage.value) == (1.0, 1.0)
    assert (first.review_share, second.review_share) == (0.0, 0.0)
    assert (first.automated_accuracy, second.automated_accuracy) == (0.9, 0.5)
    assert second.automated_lower_bound < 0.5 < first.automated_lower_bound < 0.9
    assert (first.labelled_share_auto, second.labelled_share_auto) == (1.0, 100 / 120)
    assert first.label_mass == [0] * 9 + [100] and second.label_mass == [0] * 6 + [120, 0, 0, 0]
    assert drift.reference == "the first window, 2026-12-01T00:00Z (n=100)"
    # all mass moved from bin 9 to bin 6: 2 (1 - floor) ln(1 / floor)
    shifted = 2 * (1 - PSI_FLOOR) * math.log(1 / PSI_FLOOR)
    assert (first.psi_label_mass, second.psi_label_mass) == (0.0, pytest.approx(shifted, **EXACT))
    assert (first.psi_confidence, second.psi_confidence) == (0.0, 0.0)


def test_a_profile_is_applied_and_its_fit_is_the_reference(tmp_path):
    profile = Profile(
        name="p",
        model="m.gguf",
        prompt_format_version="semif-3",
        created="2026-12-01T00:00:00Z",  # the first window starts then
        data_sha256="0",
        calibration={"choice": KindCalibration("temperature", {"temperature": 2.0})},
        threshold=Threshold(0.95, 0.7, 0.5),
        label_mass_floor=0.7,
        metrics={
            "distributions": {
                "bins": 10,
                "label_mass": [0] * 9 + [10],
                "confidence": [0] * 6 + [10, 0, 0, 0],
                "n_confidence": 10,
            }
        },
    )
    first, second = _table(*_synthetic(tmp_path), profile=profile).windows
    # softmax(log p / 2) of (0.9, 0.05, 0.05): the top is 0.9^0.5 / (0.9^0.5 + 2 * 0.05^0.5)
    top = math.sqrt(0.9) / (math.sqrt(0.9) + 2 * math.sqrt(0.05))
    assert top == pytest.approx(0.68, abs=0.01)
    assert first.confidence == [0] * 6 + [100, 0, 0, 0] and first.psi_confidence == 0.0
    # below the threshold 0.7: all to review on day 1; day 2 below the floor too
    assert (first.coverage.value, first.review_share, second.review_share) == (0.0, 1.0, 1.0)
    assert (first.labelled_share_review, first.automated_accuracy) == (1.0, None)
    assert first.psi_label_mass == 0.0 and second.psi_label_mass > 18
    drift = _table(
        *_synthetic(tmp_path),
        profile=replace(profile, prompt_format_version="semif-1", created="2026-12-01T08:00:00Z"),
    )
    assert drift.notes[0] == (
        "220 of 220 decisions have another prompt_format_version than profile p's 'semif-1'"
    )
    assert drift.notes[1].startswith("windows marked * start before profile p was created")
    assert [w.before_profile for w in drift.windows] == [True, False]
    assert drift.reference.startswith("profile p's fit: 10 items")


def test_the_command_writes_a_page_and_the_table(tmp_path, capsys):
    rec, out = _synthetic(tmp_path)
    page, table = tmp_path / "drift.html", tmp_path / "drift.json"
    argv = ["--records", str(rec), "--outcomes", str(out), "--window", "1d"]
    assert main([*argv, "--resamples", "50", "--out", str(page), "--json", str(table)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.count('src="data:image/png;base64,') == 2 and "0.500 [0.404, 0.596]" in text
    rows = json.loads(table.read_text())["windows"]
    assert [(r["start"], r["accuracy"]["value"]) for r in rows] == [
        ("2026-12-01T00:00:00Z", 0.9),
        ("2026-12-02T00:00:00Z", 0.5),
    ]
    assert (
        "200 of 220 records joined to an outcome; 20 records have none" in capsys.readouterr().err
    )
    assert main(["--records", str(rec), "--out", str(page), "--json", str(table)]) == 0
    rows = json.loads(table.read_text())["windows"]  # without outcomes: coverage and shift only
    assert [(r["labelled"], r["accuracy"], r["coverage"]["value"]) for r in rows] == [
        (0, None, 1.0),
        (0, None, 1.0),
    ]
    assert main([*argv, "--window", "1x", "--out", str(page)]) == 2
    assert "--window takes a count and a unit" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [(90, 100, 0.8256343, 0.9447709), (50, 100, 0.4038315, 0.5961685), (0, 10, 0.0, 0.2775328)],
)
def test_wilson_interval(k, n, low, high):
    ci = wilson_interval(k, n)
    assert (ci.value, ci.n) == (k / n, n)
    assert (ci.low, ci.high) == (pytest.approx(low, abs=5e-8), pytest.approx(high, abs=5e-8))


@pytest.mark.parametrize(
    ("text", "seconds"), [("30m", 1800), ("12h", 43200), ("1d", 86400), ("2w", 1209600)]
)
def test_parse_window(text, seconds):
    assert parse_window(text).total_seconds() == seconds


def test_histogram_and_psi():
    assert histogram([0.0, 0.05, 0.1, 0.99, 1.0, 1.2, -0.1]) == [3, 1, 0, 0, 0, 0, 0, 0, 0, 3]
    assert psi([5, 5], [5, 5]) == 0.0 and psi([0, 0], [1, 1]) is None
    # shares (0.8, 0.2) against (0.5, 0.5): 0.3 ln 1.6 - 0.3 ln 0.4
    assert psi([8, 2], [5, 5]) == pytest.approx(0.3 * math.log(1.6) - 0.3 * math.log(0.4), **EXACT)


def test_retried_records_and_synced_folders_give_the_same_table(tmp_path, capsys):
    """Records repeated (a client's retry) and a differing pair in synced dated folders
    neither abort the report nor change it: repeats count once, the differing pair is left
    out, both said; outcomes in a folder are read as a file is."""
    rec, out = _synthetic(tmp_path)
    page, plain, synced = tmp_path / "p.html", tmp_path / "plain.json", tmp_path / "synced.json"
    argv = ["--window", "1d", "--resamples", "50", "--out", str(page)]
    assert main([*argv, "--records", str(rec), "--outcomes", str(out), "--json", str(plain)]) == 0
    lines = rec.read_text(encoding="utf-8").splitlines()
    twin = json.loads(lines[0])
    twin["decision_id"] = "d-twin"
    other = {**twin, "options": ["a", "b", "x"]}
    folder = tmp_path / "records"
    hour1, hour2 = folder / "2026/12/02/10", folder / "2026/12/02/11"
    hour1.mkdir(parents=True)
    hour2.mkdir(parents=True)
    (hour1 / "1.jsonl").write_text("\n".join([*lines, json.dumps(twin)]) + "\n")
    (hour2 / "1.jsonl").write_text("\n".join([*lines[:30], json.dumps(other)]) + "\n")
    outcomes = tmp_path / "outcomes" / "2026/12/03/09"
    outcomes.mkdir(parents=True)
    (outcomes / "gt.jsonl").write_text(out.read_text())
    argv += ["--records", str(folder), "--outcomes", str(tmp_path / "outcomes")]
    assert main([*argv, "--json", str(synced)]) == 0
    assert json.loads(synced.read_text()) == json.loads(plain.read_text())
    err = capsys.readouterr().err
    assert (
        "; 30 records repeat a decision id read again later (the last of each kept); 1 decision "
        "ids name records that differ in prompt_hash or options: their 2 records left out "
        f"(first: 'd-twin' at {hour2 / '1.jsonl'}:31)"
    ) in err
