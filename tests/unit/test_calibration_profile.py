import json
import math
from dataclasses import replace

import pytest

from proxy.calibration.profile import (
    InvalidProfileName,
    KindCalibration,
    Profile,
    ProfileError,
    ProfileInvalid,
    ProfileMismatch,
    ProfileNotFound,
    Threshold,
    apply,
    check_compatible,
    load,
    other_build,
    profile_path,
    route,
    save,
)
from proxy.calibration.transform import sigmoid, top_index
from proxy.decision.prompt import PROMPT_FORMAT_VERSION

MODEL = "/root/.cache/semif-sidecar/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EXACT = {"rel": 1e-12, "abs": 1e-15}


def _profile(name="tickets", threshold=0.8, **calibration):
    calibration = calibration or {
        "choice": KindCalibration("temperature", {"temperature": 2.0}, 120),
        "noul": KindCalibration("platt", {"a": 2.0, "b": -1.0}, 80),
        "score": KindCalibration("isotonic", {"x": [0.4, 0.9], "y": [0.3, 0.7]}, 40),
    }
    return Profile(
        name=name,
        model=MODEL,
        prompt_format_version=PROMPT_FORMAT_VERSION,
        created="2026-11-30T12:00:00Z",
        data_sha256="ab" * 32,
        calibration=calibration,
        threshold=Threshold(
            0.95,
            threshold,
            0.4 if threshold is not None else 0.0,
            0.96 if threshold is not None else None,
            96 if threshold is not None else 0,
            10,
        ),
        debias="cyclic",
        n_items=240,
        folds=5,
        seed=0,
        metrics={"before": {"all": {"ece": 0.2}}, "after": {"all": {"ece": 0.05}}},
        llama_build="b11434-unknown",
    )


def test_round_trip_through_the_file(tmp_path):
    profile = _profile()
    path = save(profile, tmp_path)
    assert path == tmp_path / "tickets.json"
    assert load("tickets", tmp_path) == profile
    data = json.loads(path.read_text())
    assert data["profile_format"] == 1 and data["debias"] == "cyclic"
    assert data["llama_build"] == "b11434-unknown"
    assert data["calibration"]["choice"] == {
        "method": "temperature",
        "params": {"temperature": 2.0},
        "n_items": 120,
    }
    assert data["threshold"] == {
        "target_accuracy": 0.95,
        "threshold": 0.8,
        "coverage": 0.4,
        "accuracy": 0.96,
        "count": 96,
        "min_count": 10,
        "level": None,
        "lower_bound": None,
        "source": "",
        "test": {},
    }
    assert data["label_mass_floor"] == 0.0 and data["position_prior"] == {}
    assert [p.name for p in tmp_path.iterdir()] == ["tickets.json"]  # no temporary file left


def test_a_null_threshold_round_trips(tmp_path):
    save(_profile(threshold=None), tmp_path)
    assert load("tickets", tmp_path).threshold.threshold is None


@pytest.mark.parametrize(
    ("kind", "probs", "expected"),
    [
        (
            "choice",
            [0.6, 0.3, 0.1],
            [math.sqrt(x) / math.fsum(map(math.sqrt, (0.6, 0.3, 0.1))) for x in (0.6, 0.3, 0.1)],
        ),
        ("noul", [0.8, 0.2], [sigmoid(2 * math.log(4) - 1), 1 - sigmoid(2 * math.log(4) - 1)]),
        ("score", [0.65, 0.25, 0.1], [0.5, 0.25 / 0.35 * 0.5, 0.1 / 0.35 * 0.5]),
    ],
)
def test_apply_uses_the_method_of_the_question_type(kind, probs, expected):
    assert apply(_profile(), kind, probs) == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize("t", [0.1, 0.7, 1.0, 3.0, 50.0])
@pytest.mark.parametrize(
    "probs", [[0.3, 0.5, 0.2], [0.5, 0.5], [0.01, 0.01, 0.98], [0.25] * 4, [0.2, 0.2, 0.3, 0.3]]
)
def test_apply_with_temperature_never_changes_the_argmax(t, probs):
    profile = _profile(choice=KindCalibration("temperature", {"temperature": t}))
    assert top_index(apply(profile, "choice", probs)) == top_index(probs)


def test_types_without_calibration_are_left_alone():
    profile = _profile(
        choice=KindCalibration("temperature", {"temperature": 2.0}), noul=KindCalibration("none")
    )
    assert apply(profile, "score", [0.7, 0.2, 0.1]) == [0.7, 0.2, 0.1]
    assert apply(profile, "noul", [0.7, 0.3]) == [0.7, 0.3]
    assert profile.method("score") == "none" and profile.method("choice") == "temperature"


def test_apply_refuses_an_unknown_type():
    with pytest.raises(ValueError):
        apply(_profile(), "ranking", [0.5, 0.5])


@pytest.mark.parametrize(
    ("threshold", "probs", "expected"),
    [
        (0.8, [0.85, 0.15], "auto"),
        (0.8, [0.8, 0.2], "auto"),
        (0.8, [0.2, 0.79, 0.01], "review"),
        (0.8, [0.1, 0.9], "auto"),
        (None, [1.0, 0.0], "review"),
    ],
)
def test_route_by_the_threshold(threshold, probs, expected):
    reason = {"auto": "above_threshold", "review": "below_threshold"}[expected]
    if threshold is None:
        reason = "no_threshold"
    assert route(_profile(threshold=threshold), probs, 1.0) == (expected, reason)


@pytest.mark.parametrize(
    ("floor", "override", "mass", "expected"),
    [
        (0.3, None, 0.29, ("review", "label_mass")),
        (0.3, None, 0.3, ("auto", "above_threshold")),
        (0.3, 0.0, 0.02, ("auto", "above_threshold")),  # the request lowers the floor
        (0.0, 0.5, 0.4, ("review", "label_mass")),  # ... or raises it
        (0.0, None, 0.0, ("auto", "above_threshold")),
    ],
)
def test_an_answer_below_the_label_mass_floor_goes_to_review(floor, override, mass, expected):
    profile = replace(_profile(threshold=0.8), label_mass_floor=floor)
    assert route(profile, [0.99, 0.01], mass, override) == expected


def test_the_new_fields_round_trip(tmp_path):
    profile = replace(
        _profile(),
        debias="pride",
        label_mass_floor=0.31,
        position_prior={"choice": {4: (0.4, 0.3, 0.2, 0.1)}, "noul": {2: (0.6, 0.4)}},
        threshold=Threshold(
            0.9, 0.7, 0.5, 0.95, 120, 10, 0.95, 0.91, "cv answers", {"n": 50, "count": 20}
        ),
    )
    path = save(profile, tmp_path)
    assert load("tickets", tmp_path) == profile
    assert json.loads(path.read_text())["position_prior"]["choice"] == {"4": [0.4, 0.3, 0.2, 0.1]}
    assert profile.prior("choice", 4) == (0.4, 0.3, 0.2, 0.1) and profile.prior("choice", 3) is None


@pytest.mark.parametrize(
    ("model", "version"),
    [
        (MODEL, PROMPT_FORMAT_VERSION),
        ("/opt/ml/model/SmolLM2-135M-Instruct.Q4_1.gguf", PROMPT_FORMAT_VERSION),  # same file
        ("SmolLM2-135M-Instruct.Q4_1", PROMPT_FORMAT_VERSION),
    ],  # the file's stem, as --alias
)
def test_compatible_profiles_pass(model, version):
    check_compatible(_profile(), model, version)


@pytest.mark.parametrize(
    ("model", "version", "field", "words"),
    [
        (
            "/models/gemma-3-270m-it-Q4_K_M.gguf",
            PROMPT_FORMAT_VERSION,
            "model",
            [MODEL, "/models/gemma-3-270m-it-Q4_K_M.gguf"],
        ),
        ("smollm2", PROMPT_FORMAT_VERSION, "model", [MODEL, "'smollm2'"]),
        (MODEL, "semif-3", "prompt_format_version", [PROMPT_FORMAT_VERSION, "semif-3"]),
    ],
)
def test_a_profile_for_another_model_or_prompt_format_is_refused(model, version, field, words):
    with pytest.raises(ProfileMismatch) as err:
        check_compatible(_profile(), model, version)
    assert isinstance(err.value, ValueError) and err.value.field == field
    for word in (*words, "tickets"):
        assert word in str(err.value)


@pytest.mark.parametrize(
    "name",
    [
        "../secrets",
        "..",
        ".",
        ".hidden",
        "a/b",
        "a\\b",
        "/etc/passwd",
        "",
        "x\x00",
        "tickets.json/",
        "name with space",
        "ü",
        "%2e%2e",
        "tickets\n",
        "none",
        "None",
    ],  # reserved: a request's "none" asks for no calibration
)
def test_path_traversal_and_odd_names_are_refused(tmp_path, name):
    with pytest.raises(InvalidProfileName):
        profile_path(name, tmp_path)
    with pytest.raises(InvalidProfileName):
        load(name, tmp_path)
    with pytest.raises(InvalidProfileName):
        save(_profile(name=name), tmp_path)


@pytest.mark.parametrize("name", ["tickets", "tickets-v2.1", "A_b", "x"])
def test_good_names_stay_in_the_directory(tmp_path, name):
    assert profile_path(name, tmp_path) == tmp_path / f"{name}.json"


def test_a_missing_profile_is_not_found(tmp_path):
    with pytest.raises(ProfileNotFound):
        load("nothing", tmp_path)


def _corrupt(data, path, value):
    *parents, last = path
    for key in parents:
        data = data[key]
    if value is KeyError:
        del data[last]
    else:
        data[last] = value


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("profile_format",), 2),
        (("calibration", "choice", "method"), "magic"),
        (("calibration", "choice", "params", "temperature"), -1.0),
        (("calibration", "choice", "params", "temperature"), "2"),
        (("calibration", "choice", "params"), {}),
        (("calibration", "noul", "params", "a"), float("nan")),
        (("calibration", "score", "params", "y"), [0.7, 0.3]),  # decreasing
        (("calibration", "score", "params", "x"), [0.4]),  # lengths differ
        (("calibration", "ranking"), {"method": "none"}),
        (("threshold", "threshold"), 1.5),
        (("threshold", "threshold"), KeyError),
        (("threshold",), KeyError),
        (("model",), KeyError),
        (("model",), 3),
        (("debias",), "random"),
        (("debias",), "pride"),  # without a position prior
        (("position_prior",), {"choice": {"3": [0.5, 0.5]}}),
        (("position_prior",), {"choice": {"2": [0.7, 0.7]}}),
        (("position_prior",), {"score": {"2": [0.5, 0.5]}}),
        (("label_mass_floor",), 1.5),
        (("name",), "other"),  # the file holds another profile
        (("llama_build",), 11434),
    ],
)
def test_invalid_profiles_are_refused(tmp_path, path, value):
    data = _profile().to_json()
    _corrupt(data, path, value)
    (tmp_path / "tickets.json").write_text(json.dumps(data))
    with pytest.raises(ProfileInvalid):
        load("tickets", tmp_path)


def test_platt_on_a_choice_is_refused(tmp_path):
    data = _profile().to_json()
    data["calibration"]["choice"] = {"method": "platt", "params": {"a": 1.0, "b": 0.0}}
    (tmp_path / "tickets.json").write_text(json.dumps(data))
    with pytest.raises(ProfileInvalid):
        load("tickets", tmp_path)


def test_a_file_that_is_not_json_is_invalid(tmp_path):
    (tmp_path / "tickets.json").write_text("{not json")
    with pytest.raises(ProfileInvalid):
        load("tickets", tmp_path)


def test_every_profile_error_is_a_value_error():
    for cls in (InvalidProfileName, ProfileNotFound, ProfileInvalid, ProfileMismatch):
        assert issubclass(cls, ProfileError) and issubclass(cls, ValueError)


def test_a_profile_without_a_build_loads_as_unknown(tmp_path):
    data = _profile().to_json()
    del data["llama_build"]  # fitted before builds were recorded
    (tmp_path / "tickets.json").write_text(json.dumps(data))
    assert load("tickets", tmp_path).llama_build == ""


@pytest.mark.parametrize(
    ("fitted", "served", "other"),
    [
        ("b11434-unknown", "b11434-unknown", False),
        ("b11434-unknown", "b10434-1a2b3c4", True),
        ("", "b10434-1a2b3c4", False),  # not known when fitted: nothing to compare
        ("b11434-unknown", "", False),  # the server does not say
    ],
)
def test_another_build_is_told_apart(fitted, served, other):
    assert other_build(replace(_profile(), llama_build=fitted), served) is other
