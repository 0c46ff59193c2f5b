"""Confidence bounds, bootstrap intervals and the fixed-sequence threshold: exact values."""

import random

import pytest

from semif_tools.calibrate.stats import (
    THRESHOLD_GRID,
    binomial_tail,
    bootstrap_interval,
    clopper_pearson_lower,
    fewest_to_pass,
    fixed_sequence_threshold,
    quantile,
)

EXACT = {"rel": 1e-12, "abs": 1e-15}


@pytest.mark.parametrize(
    ("k", "n", "level", "bound"),
    [  # scipy.stats.beta.ppf(1 - level, k, n - k + 1), computed once outside the project
        (10, 10, 0.95, 0.7411344491069477),  # (0.05)^(1/10): 10 of 10 is not 0.95 accurate
        (9, 10, 0.95, 0.6058366975634952),
        (45, 50, 0.95, 0.8011669974835816),
        (95, 100, 0.95, 0.8977466223567255),
        (190, 200, 0.95, 0.916664848933628),
        (1, 3, 0.95, 0.0169524275084415),
        (0, 5, 0.95, 0.0),
        (10, 10, 0.99, 0.01**0.1),
    ],
)
def test_clopper_pearson_lower_bound(k, n, level, bound):
    assert clopper_pearson_lower(k, n, level) == pytest.approx(bound, **EXACT)


@pytest.mark.parametrize(("k", "n", "level"), [(3, 2, 0.95), (0, 0, 0.95), (1, 2, 1.0)])
def test_clopper_pearson_refuses_impossible_counts(k, n, level):
    with pytest.raises(ValueError):
        clopper_pearson_lower(k, n, level)


@pytest.mark.parametrize(
    ("k", "n", "p", "tail"),
    [
        (3, 10, 0.2, 1 - (0.8**10 + 10 * 0.2 * 0.8**9 + 45 * 0.2**2 * 0.8**8)),
        (0, 10, 0.2, 1.0),
        (11, 10, 0.2, 0.0),
        (10, 10, 0.5, 0.5**10),
        (1, 1, 0.0, 0.0),
    ],
)
def test_binomial_tail(k, n, p, tail):
    assert binomial_tail(k, n, p) == pytest.approx(tail, **EXACT)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4], 0.5, 2.5),
        ([4, 1, 3, 2], 0.05, 1.15),
        ([1, 2, 3, 4], 1, 4),
        ([7], 0.3, 7),
        ([1, 2, 3, 4], 0, 1),
    ],
)
def test_quantile_interpolates_between_order_statistics(values, q, expected):
    assert quantile(values, q) == pytest.approx(expected, **EXACT)


def test_bootstrap_is_the_seeded_percentile_interval():
    data = [0, 1, 1, 0, 1, 1, 1, 0, 1, 1]

    def mean(pick):
        return sum(data[i] for i in pick) / len(pick)

    got = bootstrap_interval(mean, len(data), level=0.9, resamples=200, seed=3)
    rng = random.Random(3)  # the same resamples, drawn here
    values = sorted(mean(rng.choices(range(10), k=10)) for _ in range(200))
    assert (got.value, got.n) == (0.7, 10)
    assert got.low == pytest.approx(quantile(values, 0.05), **EXACT)
    assert got.high == pytest.approx(quantile(values, 0.95), **EXACT)
    assert got.low < 0.7 < got.high
    assert bootstrap_interval(mean, 10, level=0.9, resamples=200, seed=3) == got
    constant = bootstrap_interval(lambda pick: 0.25, 10, seed=1)
    assert (constant.value, constant.low, constant.high) == (0.25, 0.25, 0.25)


def _answers(blocks):
    """(top probability, count, right) blocks as parallel lists of tops and hits."""
    tops, hits = [], []
    for top, count, right in blocks:
        tops += [top] * count
        hits += [True] * right + [False] * (count - right)
    return tops, hits


@pytest.mark.parametrize(
    ("target", "threshold", "bound", "count", "coverage"),
    [
        (0.9, 0.61, 0.916664848933628, 200, 2 / 3),  # stops at 0.60, where 240 of 300 are right
        (0.95, 0.86, 0.05**0.01, 100, 1 / 3),  # 190 of 200 bound 0.917 < 0.95: stops at 0.85
        (0.99, None, None, 0, 0.0),
    ],  # 100 of 100 bound 0.970: the first test fails
)
def test_fixed_sequence_keeps_the_last_threshold_before_the_first_failure(
    target, threshold, bound, count, coverage
):
    tops, hits = _answers([(0.95, 100, 100), (0.85, 100, 90), (0.6, 100, 50)])
    got = fixed_sequence_threshold(tops, hits, target, level=0.95, min_count=10)
    assert (got.threshold, got.count) == (threshold, count)
    assert got.coverage == pytest.approx(coverage, **EXACT)
    if bound is None:
        assert got.lower_bound is None and got.accuracy is None and got.tested == 1
    else:
        assert got.lower_bound == pytest.approx(bound, **EXACT)


def test_ten_right_of_ten_do_not_pass_a_095_target():
    # the rule it replaces (point accuracy >= target over >= 10 answers) kept 0.9 here
    got = fixed_sequence_threshold(*_answers([(0.9, 10, 10), (0.5, 10, 5)]), 0.95, min_count=10)
    assert got.threshold is None


def test_a_failure_high_up_ends_the_sequence_even_if_lower_thresholds_would_pass():
    tops, hits = _answers([(0.97, 40, 20), (0.9, 200, 200)])
    assert fixed_sequence_threshold(tops, hits, 0.9, min_count=10).threshold is None
    # without the failing block the same answers below pass
    tops, hits = _answers([(0.9, 200, 200)])
    assert fixed_sequence_threshold(tops, hits, 0.9, min_count=10).threshold == 0.01


def test_thresholds_with_too_few_answers_are_not_tested():
    tops, hits = _answers([(0.99, 5, 0), (0.9, 100, 100)])  # 5 wrong at the top: skipped
    got = fixed_sequence_threshold(tops, hits, 0.9, min_count=10)
    assert got.threshold == 0.01 and got.count == 105 and got.tested == len(THRESHOLD_GRID) - 9


def _smallest_passing_point_estimate(tops, hits, target, min_count=10):
    """The rule fixed-sequence testing replaced: the smallest threshold whose answers reach
    the target accuracy as a point estimate over at least ``min_count`` of them."""
    for t in sorted(set(tops)):
        picked = [h for p, h in zip(tops, hits) if p >= t]
        if len(picked) >= min_count and sum(picked) / len(picked) >= target:
            return t
    return None


def test_a_threshold_is_rarely_kept_where_none_reaches_the_target():
    # true accuracy 0.9 at every confidence, target 0.92: any kept threshold is a false one;
    # the fixed-sequence test keeps one in at most 5% of data sets (the level's promise),
    # the rule it replaced in most of them
    kept = old = 0
    trials = 200
    for seed in range(trials):
        rng = random.Random(seed)
        tops = [rng.uniform(0.5, 1.0) for _ in range(100)]
        hits = [rng.random() < 0.9 for _ in tops]
        kept += fixed_sequence_threshold(tops, hits, 0.92, min_count=10).threshold is not None
        old += _smallest_passing_point_estimate(tops, hits, 0.92) is not None
    assert (kept, old) == (3, 150)  # these seeds; docs/calibration.md quotes them
    assert kept <= 0.05 * trials


def test_the_grid_must_run_downwards():
    with pytest.raises(ValueError):
        fixed_sequence_threshold([0.9], [True], 0.9, grid=(0.5, 0.9))


@pytest.mark.parametrize(
    ("target", "level", "fewest"),
    [(0.95, 0.95, 59), (0.9, 0.95, 29), (0.5, 0.95, 5), (0.99, 0.9, 230), (1.0, 0.95, None)],
)
def test_fewest_answers_that_can_pass(target, level, fewest):
    assert fewest_to_pass(target, level) == fewest
    if fewest is not None:
        assert (1 - level) ** (1 / fewest) >= target > (1 - level) ** (1 / (fewest - 1))
