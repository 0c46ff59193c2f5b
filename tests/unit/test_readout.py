import math

import pytest

from proxy.decision.question import choice_question, noul_question, score_question
from proxy.decision.readout import (
    choice_confidence,
    decide,
    expected_level,
    label_mass,
    normalise,
    score_confidence,
    system_one_answer,
)

ln = math.log
EXACT = {"rel": 1e-12, "abs": 1e-15}


@pytest.mark.parametrize(
    ("logprobs", "temperature", "expected"),
    [
        ([ln(0.5), ln(0.25), ln(0.25)], 1.0, [0.5, 0.25, 0.25]),
        ([ln(0.2), ln(0.1)], 1.0, [2 / 3, 1 / 3]),  # renormalised over the labels only
        ([0.0, -ln(2)], 2.0, [math.sqrt(2) / (math.sqrt(2) + 1), 1 / (math.sqrt(2) + 1)]),
        ([ln(0.6), ln(0.3), ln(0.1)], 0.5, [36 / 46, 9 / 46, 1 / 46]),  # p^2 renormalised
        ([-1000.0, -1001.0], 1.0, [1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))]),
        ([-3.0, -3.0, -3.0, -3.0], 7.0, [0.25] * 4),
    ],
)
def test_normalise_is_the_tempered_softmax(logprobs, temperature, expected):
    assert normalise(logprobs, temperature) == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.inf, math.nan])
def test_normalise_refuses_bad_temperatures(temperature):
    with pytest.raises(ValueError):
        normalise([0.0, -1.0], temperature)


def test_normalise_refuses_all_zero_probability():
    with pytest.raises(ValueError):
        normalise([-math.inf, -math.inf])


@pytest.mark.parametrize(
    ("logprobs", "expected"),
    [([ln(0.2), ln(0.1)], 0.3), ([ln(0.5), ln(0.25), ln(0.25)], 1.0), ([ln(1e-4)] * 3, 3e-4)],
)
def test_label_mass_is_the_raw_probability_sum(logprobs, expected):
    assert label_mass(logprobs) == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize(
    ("probs", "expected"),
    [
        ([0.5, 0.25, 0.25], 0.25),  # (3*0.5 - 1) / 2
        ([1 / 3, 1 / 3, 1 / 3], 0.0),
        ([1.0, 0.0], 1.0),
        ([0.7, 0.3], 0.4),
        ([0.1, 0.2, 0.3, 0.4], (4 * 0.4 - 1) / 3),
    ],
)
def test_choice_confidence(probs, expected):
    assert choice_confidence(probs) == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize(
    ("probs", "expected"),
    [
        ([0.2, 0.5, 0.3], 0.25),  # D = 2/3, deviation 0.5 around mode 1
        ([1.0, 0.0, 0.0], 1.0),
        ([0.5, 0.0, 0.5], 0.0),  # mode 0 (first), deviation 1 > D: clipped
        ([0.7, 0.3], 0.4),  # D = 0.5
        ([0.1, 0.1, 0.6, 0.2], 1 - 0.5 / 1.0),  # D = (1.5+.5+.5+1.5)/4 = 1; dev .2+.1+.2
    ],
)
def test_score_confidence(probs, expected):
    assert score_confidence(probs) == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize(
    ("probs", "expected"), [([0.2, 0.5, 0.3], 1.1), ([1.0, 0.0], 0.0), ([0.0, 0.25, 0.75], 1.75)]
)
def test_expected_level(probs, expected):
    assert expected_level(probs) == pytest.approx(expected, **EXACT)


def test_choice_answer_in_system_one_form():
    q = choice_question({"billing": "money", "shipping": None, "technical": "bugs"})
    answer = system_one_answer(decide(q, [ln(0.1), ln(0.3), ln(0.1)]))
    assert answer["type"] == "choice"
    assert answer["choice"] == "shipping"
    assert answer["probabilities"] == pytest.approx(
        {"billing": 0.2, "shipping": 0.6, "technical": 0.2}, **EXACT
    )
    assert answer["confidence"] == pytest.approx(0.4, **EXACT)


def test_score_answer_has_legend_and_expected_level():
    q = score_question(["calm", " annoyed ", "furious"])
    answer = system_one_answer(decide(q, [ln(0.2), ln(0.5), ln(0.3)]))
    assert answer["legend"] == {"0": "calm", "1": " annoyed ", "2": "furious"}
    assert answer["score"] == pytest.approx(1.1, **EXACT)
    assert answer["confidence"] == pytest.approx(0.25, **EXACT)
    assert list(answer["probabilities"]) == ["0", "1", "2"]


def test_noul_answer_is_probability_of_true_without_confidence():
    answer = system_one_answer(decide(noul_question(None), [ln(0.3), ln(0.1)]))
    assert answer == {"type": "noul", "noul": pytest.approx(0.75, **EXACT)}


def test_temperature_keeps_the_argmax_and_flattens():
    sharp = decide(choice_question(["a", "b", "c"], temperature=1.0), [-0.1, -2.0, -3.0])
    flat = decide(choice_question(["a", "b", "c"], temperature=3.0), [-0.1, -2.0, -3.0])
    assert sharp.best == flat.best == 0
    assert flat.probabilities[0] < sharp.probabilities[0]
    assert flat.label_mass == sharp.label_mass


def test_ties_pick_the_first_option():
    assert decide(choice_question(["x", "y"]), [-1.0, -1.0]).best_name == "x"
