"""Applying a calibration profile to an outcome (pure)."""

import math
from dataclasses import replace

import pytest

from proxy.calibration.profile import KindCalibration, Profile, Threshold
from proxy.decision.question import choice_question
from proxy.decision.readout import decide
from proxy.profiles import ProfileStore, calibrate, debias_for
from proxy.service import Outcome
from proxy.upstream import ModelInfo


def _profile(method="temperature", params=None, threshold=0.5, debias=None):
    params = params if params is not None else {"temperature": 2.0}
    return Profile(name="p", model="m.gguf", prompt_format_version="semif-1", created="x",
                   data_sha256="0" * 64, calibration={"choice": KindCalibration(method, params)},
                   threshold=Threshold(0.95, threshold, 0.5), debias=debias)


def _outcome(logprobs, temperature=1.0):
    q = choice_question(["billing", "shipping"], temperature=temperature)
    return Outcome(decide(q, logprobs), ("A", "B"), "m", 10, 10, 1)


def test_temperature_profile_rescales_and_routes():
    out = calibrate(_profile(threshold=0.6), _outcome([math.log(0.8), math.log(0.2)]))
    assert out.decision.probabilities == pytest.approx((2 / 3, 1 / 3), abs=1e-12)  # sqrt, renormalised
    assert out.decision.best_name == "billing"
    assert out.calibration == {"profile": "p", "method": "temperature"}
    assert out.route == "auto"
    assert calibrate(_profile(threshold=0.7), _outcome([math.log(0.8), math.log(0.2)])).route == "review"


def test_temperature_profile_keeps_a_choice_that_rounding_ties():
    tied = _outcome([-3.0, -0.1], temperature=1e300)  # probabilities round to (0.5, 0.5)
    assert tied.decision.probabilities == (0.5, 0.5) and tied.decision.best_name == "shipping"
    assert calibrate(_profile(), tied).decision.best_name == "shipping"


def test_no_profile_leaves_the_outcome_alone():
    out = _outcome([-0.1, -2.0])
    assert calibrate(None, out) is out


@pytest.mark.parametrize(
    ("debias", "requested", "expected"),
    [(None, (), ()), ("cyclic", (), (0, 1)), ("cyclic", (0,), (0,)), (None, (0, 1), (0, 1))],
)
def test_a_profile_fitted_debiased_debiases(debias, requested, expected):
    q = choice_question(["billing", "shipping"])
    assert debias_for(_profile(debias=debias), q, requested) == expected


def test_a_profile_from_another_llama_build_is_applied_with_one_warning(tmp_path, caplog):
    store = ProfileStore(tmp_path)
    profile = replace(_profile(), llama_build="b11434-unknown")
    served = ModelInfo("m.gguf", 49152, 8192, build="b10434-abc")
    with caplog.at_level("WARNING", logger="proxy.profiles"):
        for _ in range(3):
            store.check(profile, served, param="semif.calibration")  # not refused
        store.check(profile, replace(served, build="b11434-unknown"), param="semif.calibration")
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "calibration profile 'p' was fitted on llama.cpp b11434-unknown and is applied on "
        "b10434-abc: the builds' probabilities can differ slightly; refit it on this build"]
