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


def _profile(name, model, *, version=PROMPT_FORMAT_VERSION, threshold=None, debias=None):
    temperature = {"method": "temperature", "params": {"temperature": 3.0}}
    return Profile(
        name=name, model=model, prompt_format_version=version, created="2026-11-30T00:00:00Z",
        data_sha256="0" * 64,
        calibration={k: KindCalibration(**temperature) for k in ("choice", "noul", "score")},
        threshold=Threshold(target_accuracy=0.95, threshold=threshold, coverage=0.5),
        debias=debias,
    )


@pytest.fixture(scope="module")
def calibrated(llama, logs_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("calibration")
    model = httpx.get(llama.url + "/v1/models").json()["data"][0]["id"]
    save(_profile("flat", model, threshold=0.0), folder)
    save(_profile("strict", model, threshold=1.0), folder)
    save(_profile("debiased", model, threshold=0.0, debias="cyclic"), folder)
    save(_profile("other-model", "/models/qwen3-4b.gguf"), folder)
    save(_profile("old-prompt", model, version="semif-0"), folder)
    proc, url, log = launch_proxy(logs_dir, llama.url, "--calibration-dir", str(folder),
                                  "--calibration-profile", "flat")
    yield url
    stop(proc)
    log.close()


def _ask(url, **extra):
    resp = httpx.post(url + "/v1/systemone", timeout=60,
                      json={"state": STATE, "questions": QUESTIONS, **extra})
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


def test_chat_semif_takes_a_profile(calibrated):
    body = {"messages": [{"role": "user", "content": STATE}],
            "semif": {"options": ["billing", "shipping"], "calibration": "strict"}}
    semif = httpx.post(calibrated + "/v1/chat/completions", json=body, timeout=60).json()["semif"]
    assert semif["calibration"] == {"profile": "strict", "method": "temperature"}
    assert semif["route"] == "review"


@pytest.mark.parametrize(
    ("name", "says"),
    [("other-model", "qwen3-4b"), ("old-prompt", "semif-0"), ("missing", "no calibration profile"),
     ("../etc/passwd", "invalid calibration profile name"), ("a" * 300, "at most 128")],
)
def test_unusable_profiles_are_refused_with_400(calibrated, name, says):
    s1 = httpx.post(calibrated + "/v1/systemone", timeout=60,
                    json={"state": STATE, "questions": QUESTIONS, "x_calibration": name})
    assert s1.status_code == 400 and says in json.dumps(s1.json())
    chat = httpx.post(calibrated + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": STATE}],
        "semif": {"options": ["a", "b"], "calibration": name}})
    assert chat.status_code == 400
    assert chat.json()["error"]["param"] == "semif.calibration" and says in chat.json()["error"]["message"]
