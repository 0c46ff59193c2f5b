"""Decision records and outcomes read back (semif_tools/record_files.py), and the fit from records
(semif_tools/calibrate/from_records.py): the same profile as the re-reading fit."""

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from semif_tools.calibrate import cli
from semif_tools.calibrate.dataset import data_sha256, load_items
from semif_tools.calibrate.from_records import FromRecords, fit_records, recorded_debias
from semif_tools.calibrate.profile_fit import fit_profile
from semif_tools.calibrate.read import Reading
from semif_tools.capture import read_capture
from semif_tools.outcomes import gold_index, join, load_outcomes, parse_outcome
from semif_tools.record_files import RecordError, disagreement, load_records, parse_record

MODEL, BUILD, FORMAT, SCHEME = "smollm2-135m.gguf", "b11434", "semif-3", "prefix-63"
CREATED = "2026-12-03T10:00:00Z"
ROOT = Path(__file__).resolve().parents[2]


def _softmax(logits):
    top = max(logits)
    w = [math.exp(x - top) for x in logits]
    return [x / sum(w) for x in w]


def _labelled_set(seed=3, n_choice=100, n_noul=60):
    """Labelled System One lines and, for each, the reading a proxy would give (no server)."""
    rng = random.Random(seed)
    lines, answers = [], []
    for i in range(n_choice + n_noul):
        if i < n_choice:
            probs = _softmax([rng.gauss(0, 3) for _ in range(3)])
            gold = rng.choices(range(3), weights=_softmax([math.log(p) / 1.6 for p in probs]))[0]
            question = {
                "type": "choice",
                "criteria": {"billing": None, "shipping": None, "x": None},
            }
            lines.append(
                {
                    "state": f"s{i}",
                    "questions": {"q": question},
                    "gold": "billing shipping x".split()[gold],
                }
            )
            answers.append(("choice", tuple(probs), gold))
        else:
            p = 1 / (1 + math.exp(-rng.gauss(0, 3)))
            gold = 0 if rng.random() < 0.5 + (p - 0.5) * 0.8 else 1
            lines.append(
                {"state": f"s{i}", "questions": {"q": {"type": "noul"}}, "gold": gold == 0}
            )
            answers.append(("noul", (p, 1.0 - p), gold))
    readings = [
        Reading(kind, probs, gold, FORMAT, 1, round(0.5 + 0.5 * rng.random(), 6), (), SCHEME)
        for kind, probs, gold in answers
    ]
    return lines, readings


def _record(decision_id, reading, *, time="2026-12-03T10:11:12.345Z", **over):
    names = ["true", "false"] if reading.kind == "noul" else ["billing", "shipping", "x"]
    raw = list(reading.probabilities)
    if reading.kind == "noul":  # the proxy's P(false) need not be 1 - P(true) to the last bit
        raw = [raw[0], raw[1] * (1 + 1e-12)]
    record = {
        "record": "semif.decision/1",
        "decision_id": decision_id,
        "request_id": decision_id,
        "question_id": None,
        "time": time,
        "api": "system_one",
        "model": MODEL,
        "llama_build": BUILD,
        "prompt_format_version": FORMAT,
        "layout": "conversation_first",
        "read_scheme": SCHEME,
        "prompt_tokens": 120,
        "prompt_hash": "hmac-sha256:" + "0" * 64,
        "question_type": reading.kind,
        "options": names,
        "raw_probabilities": raw,
        "probabilities": raw,
        "choice": names[0],
        "confidence": max(raw),
        "label_mass": reading.label_mass,
        "profile": None,
        "calibration_method": None,
        "threshold": None,
        "route": None,
        "route_reason": None,
        "debias": None,
        "repeatable": True,
        "latency_ms": 12.5,
    }
    return {**record, **over}


def _outcome(decision_id, label, encoding="CSV"):
    return {
        "groundTruthData": {"data": label, "encoding": encoding},
        "eventMetadata": {"eventId": decision_id},
        "eventVersion": "0",
    }


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _served(tmp_path, readings, lines):
    """Records in a shuffled (completion) order, plus one nobody labelled; outcomes in the
    labelled set's order, plus one naming no record."""
    records = [_record(f"req-{i:04d}", r) for i, r in enumerate(readings)]
    records.append(_record("req-unlabelled", readings[0]))
    random.Random(9).shuffle(records)
    outcomes = [
        _outcome(f"req-{i:04d}", json.dumps(line["gold"]), "JSON") for i, line in enumerate(lines)
    ]
    outcomes.append(_outcome("req-gone", "billing"))
    return _write(tmp_path / "records.jsonl", records), _write(
        tmp_path / "outcomes.jsonl", outcomes
    )


def test_the_fit_from_records_is_the_re_reading_fit(tmp_path):
    lines, readings = _labelled_set()
    data = _write(tmp_path / "data.jsonl", lines)
    items = load_items([data])
    assert [(i.kind, i.gold) for i in items] == [(r.kind, r.gold) for r in readings]
    rec_path, out_path = _served(tmp_path, readings, lines)
    joined = join(load_records([rec_path]), load_outcomes([out_path]))
    assert (len(joined.pairs), joined.without_outcome, len(joined.unmatched)) == (160, 1, 1)
    assert [r.decision_id for r, _ in joined.pairs] == [f"req-{i:04d}" for i in range(160)]
    settings = dict(seed=7, folds=5, target_accuracy=0.8, min_automated=10)
    sha = data_sha256([data])
    reread = fit_profile(  # as cli.main calls it after read_answers
        [r.labelled for r in readings],
        name="p",
        model=MODEL,
        prompt_format_version=cli.prompt_format_of(readings),
        data_sha256=sha,
        llama_build=BUILD,
        read_scheme=cli.read_scheme_of(readings),
        created=CREATED,
        **settings,
    )
    recorded = fit_records(joined.pairs, name="p", data_sha256=sha, created=CREATED, **settings)
    assert json.dumps(recorded.profile.to_json()) == json.dumps(reread.profile.to_json())
    assert reread.fit.roles.count("test") == 47 and reread.profile.threshold.threshold is not None
    # the order is the outcomes': the same pairs in another order are another split
    shuffled = fit_records(
        joined.pairs[::-1], name="p", data_sha256=sha, created=CREATED, **settings
    )
    assert shuffled.fit.roles[::-1] != reread.fit.roles


def test_both_commands_write_the_same_profile(tmp_path, monkeypatch, capsys):
    """calibrate DATA --write-outcomes O against a proxy with records on, then calibrate
    --records R --outcomes O: the same profile (the proxy stood in for by its readings)."""
    lines, readings = _labelled_set(seed=5, n_choice=60, n_noul=30)
    readings = [replace(r, decision_id=f"req-{i:04d}") for i, r in enumerate(readings)]
    data = _write(tmp_path / "data.jsonl", lines)
    rec_path = _served(tmp_path, readings, lines)[0]
    outcomes = tmp_path / "labels.jsonl"
    monkeypatch.setattr(cli, "served_model", lambda url, key: (MODEL, BUILD))
    monkeypatch.setattr(cli, "_read", lambda items, args, debias: readings)
    common = ["--seed", "2", "--target-accuracy", "0.8", "--out-dir"]
    argv = [str(data), "--profile", "p", "--write-outcomes", str(outcomes)]
    assert cli.main([*argv, *common, str(tmp_path / "a")]) == 0
    assert outcomes.read_text().splitlines()[:2] == [  # CSV, the encoding AWS documents
        '{"groundTruthData": {"data": "x", "encoding": "CSV"}, "eventMetadata": '
        '{"eventId": "req-0000"}, "eventVersion": "0"}',
        '{"groundTruthData": {"data": "shipping", "encoding": "CSV"}, "eventMetadata": '
        '{"eventId": "req-0001"}, "eventVersion": "0"}',
    ]
    argv = ["--records", str(rec_path), "--outcomes", str(outcomes), "--profile", "p"]
    assert cli.main([*argv, *common, str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / d / "p.json").read_text()) for d in "ab")
    # when, and from which files (the labelled set, or the records and outcomes)
    assert a.pop("created") <= b.pop("created")
    assert (a.pop("data_sha256"), b.pop("data_sha256")) == (
        data_sha256([data]),
        data_sha256([rec_path, outcomes]),
    )
    assert a == b
    assert (tmp_path / "b" / "p.report.md").exists()
    assert "90 of 91 records joined to an outcome; 1 records have none" in capsys.readouterr().err
    monkeypatch.setattr(
        cli, "_read", lambda items, args, debias: [replace(r, decision_id=None) for r in readings]
    )
    assert (
        cli.main(
            [str(data), "--profile", "p", "--write-outcomes", str(outcomes), *common, str(tmp_path)]
        )
        == 2
    )
    assert "data.jsonl:1: the proxy's answer carries no x_decision_id" in capsys.readouterr().err


def test_retried_records_in_a_synced_folder_fit_the_same_profile(tmp_path, capsys):
    """calibrate --records FOLDER --outcomes FOLDER: the records of some decisions twice (a
    client's retry, in a later hour's file) and the outcomes as --write-outcomes writes them,
    CSV, in a dated folder: the same profile as from the plain files, and no abort."""
    lines, readings = _labelled_set(seed=6, n_choice=60, n_noul=30)
    rec_path, out_path = _served(tmp_path, readings, lines)
    common = ["--profile", "p", "--seed", "2", "--target-accuracy", "0.8", "--out-dir"]
    argv = ["--records", str(rec_path), "--outcomes", str(out_path), *common]
    assert cli.main([*argv, str(tmp_path / "a")]) == 0
    records = rec_path.read_text(encoding="utf-8").splitlines()
    synced = tmp_path / "records"
    for hour, rows in (("09", records), ("10", records[::7])):
        (synced / f"2026/12/03/{hour}").mkdir(parents=True)
        (synced / f"2026/12/03/{hour}/capture.jsonl").write_text("\n".join(rows) + "\n")
    labels = tmp_path / "outcomes" / "2026/12/04/08"
    labels.mkdir(parents=True)
    (labels / "gt.jsonl").write_text(out_path.read_text())
    argv = ["--records", str(synced), "--outcomes", str(tmp_path / "outcomes"), *common]
    assert cli.main([*argv, str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / d / "p.json").read_text()) for d in "ab")
    for profile in (a, b):
        del profile["created"], profile["data_sha256"]
    assert a == b
    err = capsys.readouterr().err
    assert (
        "records: 90 of 91 records joined to an outcome; 1 records have none; 1 of 91 outcomes "
        "name no record (first: "
    ) in err
    assert "; 13 records repeat a decision id read again later (the last of each kept)" in err


@pytest.mark.parametrize(
    ("over", "message"),
    [
        (
            {"llama_build": "b11500"},
            "the records differ in llama_build: 'b11434' (58 records), 'b11500' (2 records)",
        ),
        (
            {"prompt_format_version": "semif-1", "read_scheme": "segment"},
            "the records differ in prompt_format_version: 'semif-3' (58 records), 'semif-1' "
            "(2 records); read_scheme: 'prefix-63' (58 records), 'segment' (2 records)",
        ),
    ],
)
def test_records_that_differ_are_refused_or_grouped(tmp_path, capsys, over, message):
    lines, readings = _labelled_set(n_choice=40, n_noul=20)
    records = [
        _record(f"r{i}", r, **(over if i in (3, 50) else {})) for i, r in enumerate(readings)
    ]
    outcomes = [_outcome(f"r{i}", json.dumps(line["gold"]), "JSON") for i, line in enumerate(lines)]
    rec, out = _write(tmp_path / "r.jsonl", records), _write(tmp_path / "o.jsonl", outcomes)
    pairs = join(load_records([rec]), load_outcomes([out])).pairs
    assert disagreement([r for r, _ in pairs]) == message
    argv = ["--records", str(rec), "--outcomes", str(out), "--profile", "g"]
    argv += ["--target-accuracy", "0.8", "--out-dir", str(tmp_path)]
    assert cli.main(argv) == 2
    assert f"calibrate: error: {message}. Fit each kind apart" in capsys.readouterr().err
    assert cli.main([*argv, "--group-by"]) == 2  # 2 items are too few for a test split
    assert "too few to hold out a test split" in capsys.readouterr().err


def test_pride_cannot_be_fitted_from_records(capsys):
    lines, readings = _labelled_set(n_choice=3, n_noul=0)
    records = [parse_record(_record(f"r{i}", r), "f:1") for i, r in enumerate(readings)]
    with pytest.raises(FromRecords, match="--debias pride cannot be fitted from records alone"):
        recorded_debias(records, "pride")
    argv = ["--records", "r.jsonl", "--outcomes", "o.jsonl", "--profile", "p", "--debias", "pride"]
    assert cli.main(argv) == 2  # refused before the files are opened
    assert "calibrate: error: --debias pride cannot" in capsys.readouterr().err
    cyclic = [parse_record(_record("c", readings[0], debias="cyclic"))]
    assert (
        recorded_debias(cyclic, None) == "cyclic" and recorded_debias(cyclic, "cyclic") == "cyclic"
    )
    with pytest.raises(FromRecords, match="served with debias 'cyclic'"):
        recorded_debias(cyclic, "contextual")
    with pytest.raises(FromRecords, match="served with PriDe"):
        recorded_debias([parse_record(_record("p", readings[0], debias="pride"))], None)


def test_lines_are_checked_with_their_place(tmp_path):
    _, readings = _labelled_set(n_choice=2, n_noul=0)
    good = json.dumps(_record("a", readings[0]))
    path = tmp_path / "r.jsonl"
    path.write_text(f"{good}\n\n   \n{{not json\n", encoding="utf-8")
    with pytest.raises(RecordError, match=r"r.jsonl:4: not JSON"):
        load_records([path])
    bad = _record("b", readings[0], raw_probabilities=[0.5, 0.5])
    with pytest.raises(
        RecordError, match="<record>: raw_probabilities must be a list of 3 numbers"
    ):
        parse_record(bad)
    with pytest.raises(RecordError, match=r"o:2: groundTruthData\.encoding must be"):
        parse_outcome({**_outcome("a", "x"), "groundTruthData": {"data": "x"}}, "o:2")
    with pytest.raises(RecordError, match=r"eventMetadata\.eventId"):
        parse_outcome({"groundTruthData": {"data": "x", "encoding": "CSV"}}, "o:1")


@pytest.mark.parametrize(
    ("kind", "label", "encoding", "gold"),
    [
        ("choice", "shipping", "CSV", 1),
        ("choice", '"shipping"', "CSV", 1),  # a quoted CSV field
        ("choice", '"shipping"', "JSON", 1),
        ("choice", "post", "CSV", None),
        ("noul", "false", "CSV", 1),
        ("noul", "true", "JSON", 0),
        ("noul", "yes", "CSV", None),
    ],
)
def test_an_outcome_names_an_option(kind, label, encoding, gold):
    reading = Reading(kind, (0.2, 0.8) if kind == "noul" else (0.2, 0.5, 0.3), 0, FORMAT, 1, 1.0)
    record = parse_record(_record("d", reading))
    assert gold_index(record, parse_outcome(_outcome("d", label, encoding)).label) == gold


def test_the_join_counts_what_does_not_pair():
    readings = _labelled_set(n_choice=3, n_noul=0)[1]
    records = [parse_record(_record(f"d{i}", r), f"r:{i + 1}") for i, r in enumerate(readings)]
    records.append(parse_record(_record("doc", readings[0], api="rerank"), "r:4"))
    outcomes = [
        parse_outcome(_outcome(e, label), f"o:{n}")
        for n, (e, label) in enumerate([("d2", "x"), ("d0", "post"), ("zz", "x"), ("doc", "x")], 1)
    ]
    joined = join(records, outcomes)
    assert [(r.decision_id, g) for r, g in joined.pairs] == [("d2", 2)]
    assert joined.summary() == (
        "1 of 4 records joined to an outcome; 2 records have none; 1 of 4 outcomes name no "
        "record (first: o:3); 1 outcomes name an option their record does not have (first: "
        "o:2 names 'post', options ['billing', 'shipping', 'x']); left out: 1 rerank records "
        "(1 outcomes)"
    )


def test_records_read_from_a_data_capture_file_join_their_outcomes(tmp_path):
    """records-from-capture's records (semif_tools/capture.py, the hand-written capture file
    of tests/data/capture) read back here, rerank documents left out."""
    capture = ROOT / "tests/data/capture/semif/AllTraffic/2026/12/03/10/capture-1.jsonl"
    lines = capture.read_text(encoding="utf-8").splitlines()
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"".join(c.line() for c in read_capture(lines)))
    records = load_records([path]).records
    labels = [("a1b2c3/refund", "false"), ("batch-1/2/tone", "negative"), ("rr-9/0", "1")]
    outcomes = [parse_outcome(_outcome(d, label), f"o:{n}") for n, (d, label) in enumerate(labels)]
    joined = join(records, outcomes)
    assert [(r.decision_id, r.question_type, gold) for r, gold in joined.pairs] == [
        ("a1b2c3/refund", "noul", 1),
        ("batch-1/2/tone", "choice", 1),
    ]
    assert joined.summary() == (
        "2 of 9 records joined to an outcome; 5 records have none; 0 of 3 outcomes name no "
        "record; 0 outcomes name an option their record does not have; left out: 2 rerank records "
        "(1 outcomes)"
    )
    assert disagreement([r for r, _ in joined.pairs]) is None


def test_group_by_fits_each_build_apart(tmp_path, capsys):
    lines, readings = _labelled_set(seed=4, n_choice=45, n_noul=21)
    builds = ["b11434" if i % 3 else "b11500" for i in range(len(readings))]
    records = [_record(f"r{i}", r, llama_build=b) for i, (r, b) in enumerate(zip(readings, builds))]
    outcomes = [_outcome(f"r{i}", json.dumps(line["gold"]), "JSON") for i, line in enumerate(lines)]
    rec, out = _write(tmp_path / "r.jsonl", records), _write(tmp_path / "o.jsonl", outcomes)
    argv = ["--records", str(rec), "--outcomes", str(out), "--profile", "g", "--group-by"]
    assert cli.main([*argv, "--target-accuracy", "0.8", "--out-dir", str(tmp_path)]) == 0
    fitted = [json.loads((tmp_path / f"g.{n}.json").read_text()) for n in (1, 2)]
    assert [(p["name"], p["llama_build"], p["n_items"]) for p in fitted] == [
        ("g.1", "b11434", 44),
        ("g.2", "b11500", 22),
    ]
    assert "g.2: 22 items of model 'smollm2-135m.gguf', llama_build 'b11500'" in (
        capsys.readouterr().out
    )
