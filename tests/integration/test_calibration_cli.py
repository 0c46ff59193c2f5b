"""The calibrate command against the real proxy and llama-server, and its data and report."""

import hashlib
import json
import random
import re
import struct
from collections import Counter
from pathlib import Path

import httpx
import pytest

from proxy.calibration.profile import load
from proxy.decision.prompt import PROMPT_FORMAT_VERSION
from scripts.stack import stop
from semif_tools.calibrate.cli import main
from semif_tools.calibrate.dataset import DataError, load_items, parse_item
from semif_tools.calibrate.fit import Labelled, assign_roles
from semif_tools.calibrate.profile_fit import fit_profile
from semif_tools.calibrate.report import write_report
from semif_tools.calibrate.scores import accuracy, negative_log_likelihood
from tests.conftest import launch_proxy

DATA = Path(__file__).resolve().parents[1] / "data"
SETS = ["tickets.jsonl", "sentiment.jsonl", "yesno.jsonl"]
PER_SET = 20  # 60 items: about 20 s of reads on 2 cores


def _png_size(path: Path) -> tuple[int, int]:
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    return struct.unpack(">II", raw[16:24])


def test_the_shipped_sets_parse_and_spread_the_gold_answers():
    counts = {}
    for name in SETS:
        items = load_items([DATA / name])
        counts[name] = len(items)
        bodies = [json.dumps(i.body, sort_keys=True) for i in items]
        assert len(set(bodies)) == len(bodies), f"{name} repeats an item"
        for item in items:  # one to three sentences
            assert 1 <= len(re.findall(r"[.!?](?=\s|$)", item.body["state"])) <= 3, item.source
    assert all(n >= 100 for n in counts.values()) and sum(counts.values()) >= 300
    tickets = load_items([DATA / "tickets.jsonl"])
    assert Counter(item.names[item.gold] for item in tickets) == {
        "billing": 27,
        "shipping": 27,
        "technical": 27,
        "account": 27,
    }
    assert set(Counter(item.gold for item in tickets)) == {0, 1, 2, 3}  # every position
    noul = Counter(item.gold for item in load_items([DATA / "yesno.jsonl"]))
    assert abs(noul[0] - noul[1]) <= 0.15 * sum(noul.values())


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ({"state": "s", "questions": {"q": {"type": "noul"}}}, 'missing "gold"'),
        (
            {
                "state": "s",
                "questions": {"q": {"type": "noul"}, "r": {"type": "noul"}},
                "gold": True,
            },
            "exactly one question",
        ),
        ({"state": "s", "questions": {"q": {"type": "noul"}}, "gold": "yes"}, "true or false"),
        (
            {
                "state": "s",
                "questions": {"q": {"type": "choice", "criteria": {"a": None, "b": None}}},
                "gold": "c",
            },
            "not one of the options",
        ),
        (
            {
                "state": "s",
                "questions": {"q": {"type": "score", "criteria": ["lo", "hi"]}},
                "gold": 2,
            },
            "level index 0..1",
        ),
        ({"state": "s", "questions": {"q": {"type": "ranking"}}, "gold": 1}, "question type"),
    ],
)
def test_bad_lines_are_refused_with_their_place(line, words):
    with pytest.raises(DataError) as err:
        parse_item(line, "data.jsonl:7")
    assert str(err.value).startswith("data.jsonl:7: ") and words in str(err.value)


def test_the_command_refuses_bad_names_and_bad_data(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"state": "s"}\n')
    assert main([str(bad), "--profile", "../escape", "--out-dir", str(tmp_path)]) == 2
    assert "invalid calibration profile name" in capsys.readouterr().err
    assert main([str(bad), "--profile", "ok", "--out-dir", str(tmp_path)]) == 2
    assert f"{bad}:1:" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


def _synthetic_readings(seed, n=150):
    """Choice answers that always favour the first option, right on about half the items."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        gold = rng.randrange(3) if rng.random() < 0.5 else 0
        out.append(Labelled("choice", (0.7, 0.2, 0.1), gold))
    return out


def test_report_compares_reads_with_and_without_debiasing(tmp_path):
    plain = _synthetic_readings(0)
    debiased = [
        Labelled(r.kind, (0.4, 0.35, 0.25) if r.gold == 0 else (0.3, 0.4, 0.3), r.gold)
        for r in plain
    ]
    fitted = fit_profile(
        debiased,
        name="synthetic",
        model="m.gguf",
        prompt_format_version="semif-1",
        data_sha256="0" * 64,
        debias="cyclic",
        plain=plain,
    )
    assert fitted.profile.debias == "cyclic" and fitted.plain is not None
    paths = write_report(tmp_path, fitted.profile, fitted.fit, fitted.plain)
    text = paths["report"].read_text()
    assert "## Position bias" in text
    test = fitted.fit.indices("test")
    n = len(test)
    assert f"| choice | {n} | without debiasing | 100% | 0% | 0% |" in text
    first = sum(plain[i].gold == 0 for i in test) / n  # debiased reads pick A exactly then
    assert f"| choice | {n} | cyclic debiasing | {first:.0%} | {1 - first:.0%} | 0% |" in text
    without = fitted.profile.metrics["without_debias"]
    assert without["before"]["all"]["accuracy"]["n"] == n == 44  # 30% of each gold group, rounded


@pytest.fixture(scope="module")
def calibrated(proxy_url, tmp_path_factory):
    out = tmp_path_factory.mktemp("calibration")
    subset = out / "subset.jsonl"
    lines = []
    for name in SETS:
        lines += (DATA / name).read_text(encoding="utf-8").splitlines()[:PER_SET]
    subset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return subset, out


def test_calibrate_reads_fits_and_writes_profile_and_report(proxy_url, calibrated, capfd):
    subset, out = calibrated
    rc = main(
        [
            str(subset),
            "--profile",
            "it-subset",
            "--url",
            proxy_url,
            "--out-dir",
            str(out),
            "--folds",
            "4",
            "--seed",
            "1",
        ]
    )
    captured = capfd.readouterr()
    assert rc == 0, captured.err
    assert "reading: 100%" in captured.err and "60/60" in captured.err  # the progress bar

    profile = load("it-subset", out)
    model = httpx.get(proxy_url + "/v1/models").json()["data"][0]["id"]
    assert profile.model == model and profile.prompt_format_version == PROMPT_FORMAT_VERSION
    assert profile.data_sha256 == hashlib.sha256(subset.read_bytes()).hexdigest()
    assert profile.n_items == 60 and (profile.folds, profile.seed) == (4, 1)
    assert profile.debias is None and set(profile.calibration) == {"choice", "score", "noul"}
    assert profile.threshold.target_accuracy == 0.95

    # the maps were fitted on the fit split only: counted here from the data itself
    items = load_items([subset])
    roles = assign_roles([Labelled(i.kind, (0.5, 0.5), i.gold) for i in items], 0.3, 0.3, 1)
    for kind, entry in profile.calibration.items():
        assert entry.n_items == sum(
            1 for i, r in zip(items, roles) if i.kind == kind and r == "fit"
        )
    threshold_items = roles.count("threshold")
    assert profile.threshold.source.startswith(f"threshold split: {threshold_items} items ")

    report = (out / "it-subset.report.md").read_text()
    for section in (
        "## Methods",
        "## Held-out test split",
        "## Automation threshold",
        "## Label-mass floor",
        "## Reliability",
        "it-subset.reliability.png",
        "it-subset.coverage.png",
        "held-out test split: 18 items",
    ):
        assert section in report
    for png in ("it-subset.reliability.png", "it-subset.coverage.png"):
        width, height = _png_size(out / png)
        assert width >= 500 and height >= 300


@pytest.fixture
def serving_the_profile(llama, logs_dir, calibrated):
    subset, out = calibrated
    proc, url, log = launch_proxy(logs_dir, llama.url, "--calibration-dir", str(out))
    yield url
    stop(proc)
    log.close()


def test_the_reported_figures_are_what_serving_the_profile_gives_on_the_test_items(
    serving_the_profile, calibrated
):
    """Read the held-out items again through the proxy with the profile applied: their
    accuracy and NLL, and the routes, must be the ones the profile reports (reads are
    repeatable), so the report describes what serving does, on items no choice saw."""
    subset, out = calibrated
    profile = load("it-subset", out)
    items = load_items([subset])
    roles = assign_roles([Labelled(i.kind, (0.5, 0.5), i.gold) for i in items], 0.3, 0.3, 1)
    is_test = [r == "test" for r in roles]
    probs, golds, routes = [], [], []
    with httpx.Client(base_url=serving_the_profile, timeout=120) as client:
        for item, test in zip(items, is_test):
            if not test:
                continue
            answer = client.post("/v1/systemone", json={**item.body, "x_calibration": "it-subset"})
            assert answer.status_code == 200, answer.text
            got = answer.json()["answers"][item.qid]
            if item.kind == "noul":
                p = (got["noul"], 1 - got["noul"])
            else:
                p = tuple(got["probabilities"][name] for name in item.names)
            probs.append(p)
            golds.append(item.gold)
            routes.append((got["x_route"], got["x_route_reason"], got["x_label_mass"]))
    after = profile.metrics["after"]["all"]
    assert after["accuracy"]["n"] == len(golds) == 18
    assert after["accuracy"]["value"] == pytest.approx(accuracy(probs, golds), abs=1e-9)
    assert after["nll"]["value"] == pytest.approx(negative_log_likelihood(probs, golds), rel=1e-6)
    assert after["nll"]["low"] <= after["nll"]["value"] <= after["nll"]["high"]
    floor = profile.label_mass_floor
    assert sum(mass < floor for _, _, mass in routes) == profile.threshold.test["below_floor"]
    assert all((reason == "label_mass") == (mass < floor) for _, reason, mass in routes)
    automated = sum(route == "auto" for route, _, _ in routes)
    assert automated == profile.threshold.test["count"]
