"""Applying a calibration profile to an outcome (pure)."""

import math
import re
from dataclasses import replace

import pytest

from proxy.calibration.profile import KindCalibration, Profile, Threshold
from proxy.decision.question import choice_question
from proxy.decision.readout import decide
from proxy.errors import InvalidRequest
from proxy.profile_store import DebiasPlan, ProfileStore, apply_profile, debias_for
from proxy.service import Outcome
from proxy.upstream import ModelInfo

NONE = DebiasPlan()
EXACT = {"rel": 1e-12, "abs": 1e-15}


def _profile(method="temperature", params=None, threshold=0.5, debias=None, **extra):
    params = params if params is not None else {"temperature": 2.0}
    return Profile(
        name="p",
        model="m.gguf",
        prompt_format_version="semif-1",
        created="x",
        data_sha256="0" * 64,
        calibration={"choice": KindCalibration(method, params)},
        threshold=Threshold(0.95, threshold, 0.5),
        debias=debias,
        **extra,
    )


def _outcome(logprobs, temperature=1.0):
    q = choice_question(["billing", "shipping"], temperature=temperature)
    return Outcome(decide(q, logprobs), ("A", "B"), "m", 10, 10, 1)


def test_temperature_profile_rescales_and_routes():
    out = apply_profile(_profile(threshold=0.6), _outcome([math.log(0.8), math.log(0.2)]), NONE)
    assert out.decision.probabilities == pytest.approx(
        (2 / 3, 1 / 3), abs=1e-12
    )  # sqrt, renormalised
    assert out.decision.best_name == "billing"
    assert out.calibration == {"profile": "p", "method": "temperature"}
    assert (out.route, out.route_reason) == ("auto", "above_threshold")
    low = apply_profile(_profile(threshold=0.7), _outcome([math.log(0.8), math.log(0.2)]), NONE)
    assert (low.route, low.route_reason) == ("review", "below_threshold")


def test_temperature_profile_keeps_a_choice_that_rounding_ties():
    tied = _outcome([-3.0, -0.1], temperature=1e300)  # probabilities round to (0.5, 0.5)
    assert tied.decision.probabilities == (0.5, 0.5) and tied.decision.best_name == "shipping"
    assert apply_profile(_profile(), tied, NONE).decision.best_name == "shipping"


def test_no_profile_leaves_the_outcome_alone():
    out = _outcome([-0.1, -2.0])
    assert apply_profile(None, out, NONE) is out


@pytest.mark.parametrize(
    ("debias", "method", "requested", "expected"),
    [
        (None, None, (), NONE),
        ("cyclic", None, (), DebiasPlan("cyclic", (0, 1))),
        ("cyclic", "cyclic", (0,), DebiasPlan("cyclic", (0,))),
        (None, "cyclic", (0, 1), DebiasPlan("cyclic", (0, 1))),
        (None, "contextual", (), DebiasPlan("contextual")),
        ("contextual", None, (), DebiasPlan("contextual")),
    ],
)
def test_the_request_or_the_profile_chooses_the_debiasing(debias, method, requested, expected):
    q = choice_question(["billing", "shipping"])
    assert debias_for(_profile(debias=debias), q, method, requested, param="x") == expected


PRIORS = {"choice": {2: (0.8, 0.2)}}


def test_pride_divides_the_profiles_prior_out_of_one_read_then_calibrates():
    profile = _profile(
        debias="pride", position_prior=PRIORS, threshold=0.6, params={"temperature": 1.0}
    )
    plan = debias_for(profile, choice_question(["billing", "shipping"]), None, (), param="x")
    assert plan == DebiasPlan("pride", prior=(0.8, 0.2))
    out = apply_profile(profile, _outcome([math.log(0.6), math.log(0.4)]), plan)
    # (0.6 / 0.8, 0.4 / 0.2) = (0.75, 2), normalised: the second option wins
    assert out.decision.probabilities == pytest.approx((0.75 / 2.75, 2 / 2.75), **EXACT)
    assert out.decision.best_name == "shipping" and out.debias == "pride"
    assert out.decision.label_mass == pytest.approx(1.0, **EXACT)  # the read's own


def test_pride_without_a_prior_for_the_option_count_reads_cyclically_and_says_so():
    profile = _profile(debias="pride", position_prior=PRIORS)
    plan = debias_for(profile, choice_question(["a", "b", "c"]), None, (), param="x")
    assert plan.method == "cyclic" and plan.shifts == (0, 1, 2)
    assert plan.note == (
        "no position prior for choice questions with 3 options in profile 'p': read cyclically"
    )
    assert apply_profile(profile, _outcome([-0.1, -2.0]), plan).debias_note == plan.note


@pytest.mark.parametrize("profile", [None, _profile()])
def test_pride_needs_a_profile_with_a_prior(profile):
    with pytest.raises(InvalidRequest) as err:
        debias_for(profile, choice_question(["a", "b"]), "pride", (), param="x_debias")
    assert err.value.param == "x_debias" and "--debias pride" in str(err.value)


def test_score_questions_are_never_debiased():
    from proxy.decision.question import score_question

    q = score_question(["low", "high"], loc=())
    assert debias_for(_profile(debias="cyclic"), q, "contextual", (), param="x") == NONE


def test_the_label_mass_floor_of_the_request_overrides_the_profiles():
    profile = _profile(threshold=0.6, label_mass_floor=0.5)
    out = _outcome([math.log(0.08), math.log(0.02)])  # label mass 0.1
    assert apply_profile(profile, out, NONE).route_reason == "label_mass"
    assert apply_profile(profile, out, NONE, 0.05).route_reason == "above_threshold"


def test_a_profile_from_another_llama_build_is_applied_with_one_warning(tmp_path, caplog):
    store = ProfileStore(tmp_path)
    profile = replace(_profile(), llama_build="b11434-unknown")
    served = ModelInfo("m.gguf", 49152, 8192, build="b10434-abc")
    with caplog.at_level("WARNING", logger="proxy.profile_store"):
        for _ in range(3):
            store.check(profile, served, param="semif.calibration")  # not refused
        store.check(profile, replace(served, build="b11434-unknown"), param="semif.calibration")
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "calibration profile 'p' was fitted on llama.cpp b11434-unknown and is applied on "
        "b10434-abc: the builds' probabilities can differ slightly; refit it on this build"
    ]


def test_behind_a_router_the_default_profile_applies_to_its_own_model_only(tmp_path):
    from proxy.calibration.profile import save
    from proxy.errors import ProxyError

    save(replace(_profile(), name="routing"), tmp_path)
    store = ProfileStore(tmp_path, default="routing")
    mine, other = ModelInfo("m", None, None), ModelInfo("qwen3-4b", None, None)
    assert store.select(None, param="x", info=mine).name == "routing"  # m.gguf is model m
    assert store.select(None, param="x", info=other) is None  # another model: none
    assert store.select(None, param="x").name == "routing"  # one model: the default
    # asked for by name, it is checked, and refused for the other model
    asked = store.select("routing", param="x", info=other)
    with pytest.raises(ProxyError, match=re.escape("fitted for model 'm.gguf'")):
        store.check(asked, other, param="x")


def test_a_profile_from_another_read_scheme_is_applied_with_one_warning(tmp_path, caplog):
    store = ProfileStore(tmp_path)
    profile = replace(_profile(), read_scheme="segment")
    served = ModelInfo("m.gguf", 49152, 8192)
    with caplog.at_level("WARNING", logger="proxy.profile_store"):
        for _ in range(2):
            store.check(profile, served, param="semif.calibration", scheme="prefix-63")
        store.check(profile, served, param="semif.calibration", scheme="segment")
    assert [r.getMessage() for r in caplog.records] == [
        "calibration profile 'p' was fitted on reads of the segment scheme and is applied on "
        "prefix-63: the numbers can differ slightly; refit it (docs/calibration.md)"
    ]


def test_a_profile_is_refused_for_a_request_in_another_layout(tmp_path):
    from proxy.errors import ProfileRefused

    store = ProfileStore(tmp_path)
    served = ModelInfo("m.gguf", 49152, 8192)
    store.check(_profile(), served, param="semif.calibration", version="semif-1")
    with pytest.raises(ProfileRefused, match="'semif-1', but this server uses 'semif-3'"):
        store.check(_profile(), served, param="semif.calibration", version="semif-3")


def test_a_profile_keeps_its_read_scheme():
    profile = replace(_profile(), read_scheme="prefix-63")
    assert Profile.from_json(profile.to_json()) == profile
    older = {k: v for k, v in profile.to_json().items() if k != "read_scheme"}
    assert Profile.from_json(older).read_scheme == ""  # a profile written before the field
