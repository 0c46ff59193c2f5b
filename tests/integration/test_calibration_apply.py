"""Profiles applied at serving time: picked per request or by default, refused when
fitted for something else, never changing the argmax under temperature scaling."""

import json
import math

import httpx
import pytest

from proxy.calibration.profile import KindCalibration, Profile, Threshold, save
from proxy.decision.prompt import PROMPT_FORMAT_VERSION
from scripts.stack import stop
from tests.conftest import launch_proxy

STATE = "Hello, I was charged twice for my order and want my money back."
QUESTIONS = {
    "team": {"type": "choice", "criteria": {"billing": None, "shipping": None, "technical": None}},
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
}


PRIOR = (0.5, 0.3, 0.2)


def _profile(name, model, *, version=PROMPT_FORMAT_VERSION, threshold=None, debias=None, **extra):
    temperature = {"method": "temperature", "params": {"temperature": 3.0}}
    return Profile(
        name=name,
        model=model,
        prompt_format_version=version,
        created="2026-11-30T00:00:00Z",
        data_sha256="0" * 64,
        calibration={k: KindCalibration(**temperature) for k in ("choice", "noul", "score")},
        threshold=Threshold(target_accuracy=0.95, threshold=threshold, coverage=0.5),
        debias=debias,
        **extra,
    )


@pytest.fixture(scope="module")
def calibrated(llama, logs_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("calibration")
    model = httpx.get(llama.url + "/v1/models").json()["data"][0]["id"]
    save(_profile("flat", model, threshold=0.0), folder)
    save(_profile("strict", model, threshold=1.0), folder)
    save(_profile("debiased", model, threshold=0.0, debias="cyclic"), folder)
    save(
        _profile(
            "pride", model, threshold=0.0, debias="pride", position_prior={"choice": {3: PRIOR}}
        ),
        folder,
    )
    save(_profile("floored", model, threshold=0.0, label_mass_floor=1.0), folder)
    save(_profile("other-model", "/models/qwen3-4b.gguf"), folder)
    save(_profile("old-prompt", model, version="semif-0"), folder)
    proc, url, log = launch_proxy(
        logs_dir, llama.url, "--calibration-dir", str(folder), "--calibration-profile", "flat"
    )
    yield url
    stop(proc)
    log.close()


def _ask(url, **extra):
    resp = httpx.post(
        url + "/v1/systemone", timeout=60, json={"state": STATE, "questions": QUESTIONS, **extra}
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["answers"]


def test_temperature_profile_flattens_without_changing_the_choice(calibrated, llama):
    llama.wait_idle()
    _ask(calibrated, x_calibration="none")  # warm: both reads below come from the cache
    raw = _ask(calibrated, x_calibration="none")["team"]
    cal = _ask(calibrated, x_calibration="flat")["team"]
    assert "x_calibration" not in raw
    assert cal["x_calibration"] == {"profile": "flat", "method": "temperature"}
    assert cal["choice"] == raw["choice"]
    root = {k: v ** (1 / 3) for k, v in raw["probabilities"].items()}
    total = math.fsum(root.values())
    for k, v in root.items():
        assert cal["probabilities"][k] == pytest.approx(v / total, abs=1e-6)
    assert max(cal["probabilities"].values()) < max(raw["probabilities"].values())


def test_default_profile_applies_when_none_is_named(calibrated):
    answers = _ask(calibrated)
    assert answers["team"]["x_calibration"]["profile"] == "flat"
    assert answers["refund"]["x_route"] == "auto"  # threshold 0: everything automated


def test_threshold_decides_the_route(calibrated):
    assert {a["x_route"] for a in _ask(calibrated, x_calibration="strict").values()} == {"review"}


def test_profile_fitted_debiased_reads_debiased(calibrated):
    answers = _ask(calibrated, x_calibration="debiased")
    assert answers["team"]["x_reads"] == 3 and answers["refund"]["x_reads"] == 2


def test_a_pride_profile_divides_its_prior_out_of_one_read(calibrated):
    raw = _ask(calibrated, x_calibration="none")["team"]
    answers = _ask(calibrated, x_calibration="pride")
    team = answers["team"]
    assert team["x_debias"] == "pride" and team["x_reads"] == raw["x_reads"]
    names = list(QUESTIONS["team"]["criteria"])
    divided = [raw["probabilities"][n] / w for n, w in zip(names, PRIOR)]
    rooted = [(x / math.fsum(divided)) ** (1 / 3) for x in divided]  # then temperature 3
    for n, x in zip(names, rooted):
        assert team["probabilities"][n] == pytest.approx(x / math.fsum(rooted), rel=1e-9)
    # no prior for two options: read cyclically, and the answer says why
    assert answers["refund"]["x_debias"] == "cyclic" and answers["refund"]["x_reads"] == 2
    assert (
        "no position prior for noul questions with 2 options" in answers["refund"]["x_debias_note"]
    )


def test_the_label_mass_floor_routes_to_review_and_a_request_can_lower_it(calibrated):
    floored = _ask(calibrated, x_calibration="floored")["team"]
    assert (floored["x_route"], floored["x_route_reason"]) == ("review", "label_mass")
    assert floored["x_label_mass"] < 1.0  # the rest of the vocabulary held some
    lowered = _ask(calibrated, x_calibration="floored", x_label_mass_floor=0.0)["team"]
    assert (lowered["x_route"], lowered["x_route_reason"]) == ("auto", "above_threshold")
    body = {
        "messages": [{"role": "user", "content": STATE}],
        "semif": {
            "options": ["billing", "shipping"],
            "calibration": "floored",
            "label_mass_floor": 2,
        },
    }
    bad = httpx.post(calibrated + "/v1/chat/completions", json=body, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "semif.label_mass_floor"


def test_chat_semif_takes_a_profile(calibrated):
    body = {
        "messages": [{"role": "user", "content": STATE}],
        "semif": {"options": ["billing", "shipping"], "calibration": "strict"},
    }
    semif = httpx.post(calibrated + "/v1/chat/completions", json=body, timeout=60).json()["semif"]
    assert semif["calibration"] == {"profile": "strict", "method": "temperature"}
    assert (semif["route"], semif["route_reason"]) == ("review", "below_threshold")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("other-model", "qwen3-4b"),
        ("old-prompt", "semif-0"),
        ("missing", "no calibration profile"),
        ("../etc/passwd", "invalid calibration profile name"),
        ("a" * 300, "at most 128"),
    ],
)
def test_unusable_profiles_are_refused_with_a_4xx(calibrated, name, says):
    s1 = httpx.post(
        calibrated + "/v1/systemone",
        timeout=60,
        json={"state": STATE, "questions": QUESTIONS, "x_calibration": name},
    )
    # System One's documented validation shape
    assert s1.status_code == 422 and says in json.dumps(s1.json())
    (detail,) = s1.json()["detail"]
    assert detail["loc"] == ["body", "x_calibration"] and detail["type"] == "calibration_profile"
    chat = httpx.post(
        calibrated + "/v1/chat/completions",
        timeout=60,
        json={
            "messages": [{"role": "user", "content": STATE}],
            "semif": {"options": ["a", "b"], "calibration": name},
        },
    )
    assert chat.status_code == 400
    assert (
        chat.json()["error"]["param"] == "semif.calibration"
        and says in chat.json()["error"]["message"]
    )
