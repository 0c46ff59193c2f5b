import math

import pytest

from proxy.decision.debias import DebiasError, average, rotate, shifts
from proxy.decision.question import choice_question, noul_question, score_question
from proxy.decision.readout import decide

ln = math.log


@pytest.mark.parametrize(
    ("n", "k", "expected"),
    [
        (3, None, [0, 1, 2]),
        (8, None, [0, 1, 2, 3, 4, 5, 6, 7]),
        (10, None, [0, 1, 2, 3, 5, 6, 7, 8]),  # floor(i * 10 / 8)
        (26, 4, [0, 6, 13, 19]),
        (5, 1, [0]),
    ],
)
def test_shifts_spread_evenly(n, k, expected):
    assert shifts(n, k) == expected


@pytest.mark.parametrize(("n", "k"), [(3, 0), (3, 4)])
def test_shift_count_is_bounded(n, k):
    with pytest.raises(DebiasError):
        shifts(n, k)


def test_rotate_moves_names_and_shown_together():
    q = choice_question({"a": "first", "b": None, "c": "third"})
    r = rotate(q, 1)
    assert r.names == ("b", "c", "a")
    assert r.shown == ("b", "c - third", "a - first")
    assert rotate(noul_question(None), 1).names == ("false", "true")


def test_score_questions_are_not_rotated():
    with pytest.raises(DebiasError):
        rotate(score_question(["low", "high"]), 1)


def test_a_pure_position_preference_averages_out_to_uniform():
    """A model that puts 0.7 on whatever is shown first, whatever the options are."""
    q = choice_question(["a", "b", "c"])
    position_only = [ln(0.7), ln(0.2), ln(0.1)]
    reads = [(s, decide(rotate(q, s), position_only)) for s in shifts(3)]
    result = average(q, reads)
    assert result.probabilities == pytest.approx((1 / 3, 1 / 3, 1 / 3), abs=1e-12)


def test_average_maps_each_read_back_to_option_names():
    q = choice_question(["a", "b"])
    r0 = decide(q, [ln(0.9), ln(0.1)])  # shown a, b: a 0.9
    r1 = decide(rotate(q, 1), [ln(0.3), ln(0.7)])  # shown b, a: b 0.3, a 0.7
    result = average(q, [(0, r0), (1, r1)])
    assert result.probabilities == pytest.approx((0.8, 0.2), abs=1e-12)
    assert result.best_name == "a"
    assert result.label_mass == pytest.approx(1.0, abs=1e-12)
