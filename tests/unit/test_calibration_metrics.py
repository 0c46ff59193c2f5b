import math

import pytest

from proxy.calibration.transform import top_index
from semif_tools.calibrate.scores import (
    Bin,
    CurvePoint,
    accuracy,
    brier_score,
    coverage_curve,
    expected_calibration_error,
    negative_log_likelihood,
    position_shares,
    reliability_bins,
    summary,
)

EXACT = {"rel": 1e-12, "abs": 1e-15}

# four binary answers, one per bin 9, 8, 7, 6: right, wrong, right, wrong
FOUR = ([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], [0, 1, 1, 1])


@pytest.mark.parametrize(
    ("probs", "golds", "expected"),
    [
        (*FOUR, 0.5),
        ([[1 / 3, 1 / 3, 1 / 3]], [0], 1.0),  # ties choose the first option
        ([[1 / 3, 1 / 3, 1 / 3]], [1], 0.0),
        ([[0.2, 0.8], [0.6, 0.4], [0.1, 0.9]], [1, 0, 1], 1.0),
    ],
)
def test_accuracy(probs, golds, expected):
    assert accuracy(probs, golds) == expected


@pytest.mark.parametrize(
    ("probs", "golds", "expected"),
    [
        # (|1-0.9| + |0-0.8| + |1-0.7| + |0-0.6|) / 4
        (*FOUR, 0.45),
        # one bin [0.5, 0.6): confidence (0.55+0.58)/2 = 0.565, accuracy 1/2
        ([[0.55, 0.45], [0.58, 0.42]], [0, 1], 0.065),
        # bins 5, 6, 3: (|1-0.5| + |0-0.6| + |1-1/3|) / 3
        (
            [[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [1 / 3, 1 / 3, 1 / 3]],
            [0, 1, 0],
            (0.5 + 0.6 + 2 / 3) / 3,
        ),
        # weighted by bin count: bin 9 holds 3 answers (2 right), bin 5 one wrong answer
        (
            [[0.95, 0.05], [0.91, 0.09], [0.99, 0.01], [0.5, 0.5]],
            [0, 0, 1, 1],
            3 / 4 * abs(2 / 3 - (0.95 + 0.91 + 0.99) / 3) + 1 / 4 * 0.5,
        ),
        ([[1.0, 0.0]], [0], 0.0),  # 1.0 belongs to the last bin
        ([[1.0, 0.0]], [1], 1.0),
    ],
)
def test_expected_calibration_error(probs, golds, expected):
    assert expected_calibration_error(probs, golds) == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize(
    ("probs", "golds", "expected"),
    [
        ([[0.9, 0.1]], [0], 0.02),  # 0.1^2 + 0.1^2
        ([[0.5, 0.3, 0.2]], [1], 0.78),  # 0.5^2 + 0.7^2 + 0.2^2
        ([[0.9, 0.1], [0.5, 0.3, 0.2]], [0, 1], 0.4),
        ([[1.0, 0.0], [0.0, 1.0]], [0, 0], 1.0),  # (0 + 2) / 2
        ([[0.25] * 4], [3], 0.75),  # 3 * 0.0625 + 0.5625
    ],
)
def test_brier_score_is_multiclass(probs, golds, expected):
    assert brier_score(probs, golds) == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize(
    ("probs", "golds", "expected"),
    [
        ([[0.9, 0.1], [0.5, 0.3, 0.2]], [0, 1], -(math.log(0.9) + math.log(0.3)) / 2),
        ([[0.25] * 4], [2], math.log(4)),
        ([[1.0, 0.0]], [1], -math.log(1e-12)),  # clipped, not infinite
        ([[1.0, 0.0], [0.5, 0.5]], [0, 1], math.log(2) / 2),
    ],
)
def test_negative_log_likelihood(probs, golds, expected):
    assert negative_log_likelihood(probs, golds) == pytest.approx(expected, **EXACT)


def test_reliability_bins_count_confidence_and_accuracy():
    bins = reliability_bins([[0.55, 0.45], [0.58, 0.42], [0.95, 0.05], [1.0, 0.0]], [0, 1, 0, 1])
    assert len(bins) == 10 and [b.count for b in bins] == [0, 0, 0, 0, 0, 2, 0, 0, 0, 2]
    assert bins[0] == Bin(0.0, 0.1, 0, None, None)
    assert (bins[5].lower, bins[5].upper) == (0.5, 0.6)
    assert bins[5].confidence == pytest.approx(0.565, **EXACT) and bins[5].accuracy == 0.5
    assert bins[9].confidence == pytest.approx(0.975, **EXACT) and bins[9].accuracy == 0.5


def test_coverage_curve_groups_equal_tops():
    probs = [[0.9, 0.1], [0.8, 0.2], [0.2, 0.8], [0.6, 0.4]]
    golds = [0, 1, 1, 1]  # right, wrong, right, wrong
    assert coverage_curve(probs, golds) == [
        CurvePoint(0.6, 1.0, 0.5, 4),
        CurvePoint(0.8, 0.75, 2 / 3, 3),
        CurvePoint(0.9, 0.25, 1.0, 1),
    ]


@pytest.mark.parametrize(
    ("positions", "n", "expected"),
    [([0, 0, 1, 3], 4, [0.5, 0.25, 0.0, 0.25]), ([1, 1], 2, [0.0, 1.0]), ([2], 2, [0.0, 0.0])],
)
def test_position_shares(positions, n, expected):
    assert position_shares(positions, n) == expected


@pytest.mark.parametrize(
    ("probs", "expected"), [([0.2, 0.5, 0.3], 1), ([0.4, 0.4, 0.2], 0), ([0.1, 0.45, 0.45], 1)]
)
def test_top_index_takes_the_first_on_ties(probs, expected):
    assert top_index(probs) == expected


def test_summary_holds_every_metric():
    probs, golds = FOUR
    assert summary(probs, golds) == {
        "n": 4,
        "accuracy": 0.5,
        "ece": expected_calibration_error(probs, golds),
        "brier": brier_score(probs, golds),
        "nll": negative_log_likelihood(probs, golds),
    }


@pytest.mark.parametrize(
    ("probs", "golds"),
    [([], []), ([[0.5, 0.5]], []), ([[0.5, 0.5]], [2]), ([[0.5, 0.5]], [-1])],
)
def test_bad_inputs_are_refused(probs, golds):
    with pytest.raises(ValueError):
        negative_log_likelihood(probs, golds)
