import math
import random

import pytest

from proxy.calibration.transform import (
    apply_method,
    isotonic_map,
    isotonic_scale,
    platt_scale,
    sigmoid,
    temperature_scale,
    top_index,
)
from proxy.decision.readout import normalise
from semif_tools.calibrate.fit import (
    Labelled,
    assign_roles,
    fit_calibration,
    fit_isotonic,
    fit_kind,
    fit_label_mass_floor,
    fit_method,
    fit_platt,
    fit_temperature,
    fold_ids,
    held_out,
    split_roles,
)
from semif_tools.calibrate.scores import negative_log_likelihood

EXACT = {"rel": 1e-12, "abs": 1e-15}


def _softmax(logits):
    top = max(logits)
    w = [math.exp(x - top) for x in logits]
    return [x / sum(w) for x in w]


def _synthetic(seed, n, true_t, k=4, spread=4.0):
    """Logits ~ N(0, spread); the answers report softmax(logits), the labels are drawn from
    softmax(logits / true_t): a model whose probabilities need temperature true_t."""
    rng = random.Random(seed)
    probs, golds = [], []
    for _ in range(n):
        logits = [rng.gauss(0, spread) for _ in range(k)]
        golds.append(rng.choices(range(k), weights=_softmax([x / true_t for x in logits]))[0])
        probs.append(_softmax(logits))
    return probs, golds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_temperature_fit_recovers_the_true_temperature(seed):
    probs, golds = _synthetic(seed, 5000, 2.5)
    assert fit_temperature(probs, golds) == pytest.approx(2.5, rel=0.05)


@pytest.mark.parametrize(("true_t", "k"), [(0.5, 3), (1.0, 5)])
def test_temperature_fit_recovers_sharpening_and_identity(true_t, k):
    probs, golds = _synthetic(7, 5000, true_t, k=k, spread=2.0)
    assert fit_temperature(probs, golds) == pytest.approx(true_t, rel=0.05)


def test_temperature_fit_closed_form():
    # every answer has logit gap 2; 3 of 4 are right, so sigmoid(2 / T) = 3/4: T = 2 / ln 3
    p = sigmoid(2.0)
    t = fit_temperature([[p, 1 - p]] * 4, [0, 0, 0, 1])
    assert t == pytest.approx(2 / math.log(3), rel=1e-6)


@pytest.mark.parametrize(
    ("probs", "t", "expected"),
    [
        ([0.6, 0.3, 0.1], 0.5, [36 / 46, 9 / 46, 1 / 46]),  # p^2 renormalised
        ([0.5, 0.25, 0.25], 1.0, [0.5, 0.25, 0.25]),
        (
            [0.8, 0.2],
            2.0,
            [
                math.sqrt(0.8) / (math.sqrt(0.8) + math.sqrt(0.2)),
                math.sqrt(0.2) / (math.sqrt(0.8) + math.sqrt(0.2)),
            ],
        ),
        ([1.0, 0.0], 3.0, [1.0, 0.0]),
    ],
)
def test_temperature_scale_is_p_to_the_one_over_t(probs, t, expected):
    assert temperature_scale(probs, t) == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize("t", [0.05, 0.5, 1.0, 2.5, 40.0, 100.0])
@pytest.mark.parametrize(
    "probs",
    [
        [0.2, 0.5, 0.3],
        [0.4, 0.4, 0.2],
        [0.1, 0.45, 0.45],
        [0.99, 0.01],
        [1e-30, 1 - 1e-30],
        [0.35, math.nextafter(0.35, 1.0), 0.3 - 5.6e-17],  # neighbours one ulp apart
        [0.0, 0.0, 1.0],
        [0.25] * 4,
    ],
)
def test_temperature_never_changes_the_choice(probs, t):
    out = temperature_scale(probs, t)
    assert top_index(out) == top_index(probs)
    assert math.fsum(out) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("t", [0.5, 2.5])
def test_temperature_scale_matches_the_proxys_tempered_softmax(t):
    probs = [0.55, 0.3, 0.1, 0.05]
    assert temperature_scale(probs, t) == pytest.approx(
        normalise([math.log(p) for p in probs], t), **EXACT
    )


def test_platt_recovers_slope_and_intercept():
    rng = random.Random(3)
    xs = [rng.gauss(0, 2) for _ in range(5000)]
    ys = [rng.random() < sigmoid(1.5 * x - 0.5) for x in xs]
    a, b = fit_platt([sigmoid(x) for x in xs], ys)
    assert a == pytest.approx(1.5, rel=0.1) and b == pytest.approx(-0.5, abs=0.1)


def test_platt_stays_finite_on_separable_data():
    a, b = fit_platt([0.1, 0.2, 0.8, 0.9], [False, False, True, True])
    assert math.isfinite(a) and math.isfinite(b) and a > 0
    assert platt_scale([0.9, 0.1], a, b)[0] > 0.5 > platt_scale([0.1, 0.9], a, b)[0]


def test_platt_scale_formula():
    assert platt_scale([0.8, 0.2], 2.0, -1.0) == pytest.approx(
        [sigmoid(2 * math.log(4) - 1), 1 - sigmoid(2 * math.log(4) - 1)], **EXACT
    )


@pytest.mark.parametrize(
    ("xs", "ys", "knots"),
    [
        ([0.1, 0.2, 0.3, 0.4], [0, 1, 0, 1], ([0.1, 0.25, 0.4], [0.0, 0.5, 1.0])),
        ([0.4, 0.3, 0.2, 0.1], [0, 0, 1, 1], ([0.25], [0.5])),  # all decreasing: one block
        ([0.1, 0.5, 0.9], [0, 0.5, 1], ([0.1, 0.5, 0.9], [0.0, 0.5, 1.0])),  # already monotone
        ([0.2, 0.2, 0.1], [1, 0, 0], ([0.1, 0.2], [0.0, 0.5])),  # equal xs pooled
        ([0.6, 0.7, 0.7, 0.8], [1, 0, 0, 1], ([2 / 3, 0.8], [1 / 3, 1.0])),
    ],
)
def test_isotonic_pool_adjacent_violators(xs, ys, knots):
    kx, ky = fit_isotonic(xs, ys)
    assert kx == pytest.approx(knots[0], **EXACT) and ky == pytest.approx(knots[1], **EXACT)


@pytest.mark.parametrize(
    ("x", "expected"),
    [(0.0, 0.0), (0.1, 0.0), (0.2, 1 / 3), (0.25, 0.5), (0.325, 0.75), (0.4, 1.0), (0.9, 1.0)],
)
def test_isotonic_map_is_piecewise_linear(x, expected):
    assert isotonic_map(x, [0.1, 0.25, 0.4], [0.0, 0.5, 1.0]) == pytest.approx(expected, **EXACT)


@pytest.mark.parametrize(
    ("probs", "mapped_to", "expected"),
    [
        ([0.6, 0.3, 0.1], 0.8, [0.8, 0.15, 0.05]),  # others keep their ratio
        ([0.5, 0.4, 0.1], 0.2, [4 / 9, 4 / 9, 1 / 9]),  # raised to where the runner-up ties
        ([1.0, 0.0, 0.0], 0.6, [0.6, 0.2, 0.2]),  # a certain answer shares evenly
    ],
)
def test_isotonic_scale_for_choice(probs, mapped_to, expected):
    out = isotonic_scale(probs, "choice", [0.0, 1.0], [mapped_to, mapped_to])
    assert out == pytest.approx(expected, rel=1e-9)
    assert top_index(out) == top_index(probs)


def test_isotonic_scale_for_noul_maps_p_true():
    assert isotonic_scale([0.7, 0.3], "noul", [0.5, 0.9], [0.2, 0.6]) == pytest.approx([0.4, 0.6])


def test_fold_ids_are_deterministic_and_balanced():
    a, b = fold_ids(23, 5, seed=0), fold_ids(23, 5, seed=0)
    assert a == b and a != fold_ids(23, 5, seed=1)
    assert sorted(a.count(f) for f in range(5)) == [4, 4, 5, 5, 5]


def test_held_out_answers_never_see_their_own_label():
    # one item per fold of 2; a method fitted on the other item only
    probs, golds = [[0.9, 0.1], [0.9, 0.1]], [0, 1]
    out = held_out("isotonic", "noul", probs, golds, [0, 1])
    assert out == [[0.0, 1.0], [1.0, 0.0]]  # each item gets the other's label


def _nll_rule_holds(fit):
    nll, method = fit.held_out_nll, fit.method
    if method == "none":
        return all(v >= nll["none"] for m, v in nll.items() if m != "none")
    beats = nll[method] < nll["none"] and nll[method] == min(nll.values())
    extra_ok = (
        method == "temperature" or "temperature" not in nll or nll[method] < nll["temperature"]
    )
    return beats and extra_ok


@pytest.mark.parametrize(
    ("kind", "seed", "true_t", "k"),
    [
        ("choice", 0, 2.5, 4),
        ("choice", 1, 1.0, 3),
        ("noul", 2, 0.7, 2),
        ("noul", 3, 1.0, 2),
        ("score", 4, 3.0, 5),
    ],
)
def test_fit_kind_keeps_a_method_only_if_it_beats_the_baseline(kind, seed, true_t, k):
    probs, golds = _synthetic(seed, 300, true_t, k=k, spread=3.0)
    fit = fit_kind(kind, probs, golds, ["temperature", "platt", "isotonic"], 5, seed)
    assert _nll_rule_holds(fit)
    assert negative_log_likelihood(fit.after, golds) == pytest.approx(fit.held_out_nll[fit.method])


def test_miscalibrated_answers_get_a_method_that_lowers_held_out_nll():
    probs, golds = _synthetic(5, 600, 3.0)
    fit = fit_kind("choice", probs, golds, ["temperature"], 5, 0)
    assert fit.method == "temperature" and fit.params["temperature"] == pytest.approx(3.0, rel=0.2)
    assert fit.held_out_nll["temperature"] < fit.held_out_nll["none"]


def test_too_few_items_stay_uncalibrated():
    fit = fit_kind("noul", [[0.6, 0.4]] * 8, [0] * 8, ["temperature"], 5, 0)
    assert (fit.method, fit.params) == ("none", {}) and "too few" in fit.note


def _items(seed=0):
    choice_p, choice_g = _synthetic(8, 200, 2.5)
    noul_p, noul_g = _synthetic(9, 120, 2.0, k=2)
    items = [Labelled("choice", tuple(p), g, 0.9) for p, g in zip(choice_p, choice_g)]
    items += [Labelled("noul", tuple(p), g, 0.8) for p, g in zip(noul_p, noul_g)]
    random.Random(seed).shuffle(items)
    return items


def test_fit_calibration_fits_each_type_and_keeps_item_order():
    items = _items()
    fit = fit_calibration(items, folds=5, seed=0, target_accuracy=0.9)
    assert set(fit.kinds) == {"choice", "noul"}
    assert fit.golds == [i.gold for i in items]
    assert fit.before == [list(i.probabilities) for i in items]
    for item, after in zip(items, fit.after):
        assert len(after) == len(item.probabilities)
    test = fit.metrics("after")  # the held-out test split
    assert set(test) == {"all", "choice", "noul"} and test["all"]["n"] == 96  # 30% of 320
    # 30% of the other 224 test thresholds; the maps see the remaining 157
    assert [len(fit.indices(part)) for part in ("fit", "threshold", "all")] == [157, 67, 320]
    assert test["all"]["nll"] < fit.metrics("before")["all"]["nll"]
    assert fit.kinds["choice"].n == 98  # the map was fitted on the fit split only
    ci = fit.intervals("after")["all"]["nll"]
    assert ci.n == 96 and ci.value == pytest.approx(test["all"]["nll"], **EXACT)
    assert ci.low < ci.value < ci.high


def test_nothing_chosen_depends_on_the_test_split():
    items = _items()
    fit = fit_calibration(items, seed=0, target_accuracy=0.6)
    # rewrite every test item's answer and label mass (the split is drawn within golds)
    flipped = [
        Labelled(it.kind, tuple(reversed(it.probabilities)), it.gold, 0.01) if t else it
        for it, t in zip(items, fit.is_test)
    ]
    refit = fit_calibration(flipped, seed=0, target_accuracy=0.6)
    assert refit.is_test == fit.is_test
    assert {k: (f.method, f.params) for k, f in refit.kinds.items()} == {
        k: (f.method, f.params) for k, f in fit.kinds.items()
    }
    assert refit.threshold == fit.threshold and refit.label_mass_floor == fit.label_mass_floor
    assert refit.metrics("after") != fit.metrics("after")  # the report sees them


@pytest.mark.parametrize(
    ("sizes", "share", "expected"),
    [({0: 10, 1: 10}, 0.3, {0: 3, 1: 3}), ({0: 7, 1: 1}, 0.3, {0: 2, 1: 0}), ({0: 5}, 0.5, {0: 2})],
)  # round half to even
def test_the_test_split_is_drawn_within_each_gold_answer(sizes, share, expected):
    items = [Labelled("noul", (0.5, 0.5), g) for g, n in sizes.items() for _ in range(n)]
    roles = split_roles(items, share, seed=4)
    assert {g: sum(t for it, t in zip(items, roles) if it.gold == g) for g in sizes} == expected
    assert split_roles(items, share, seed=4) == roles


def test_the_three_parts_are_disjoint_and_drawn_within_each_gold_answer():
    items = [Labelled("choice", (0.5, 0.5), g) for g in (0, 1) for _ in range(50)]
    roles = assign_roles(items, 0.3, 0.3, seed=2)
    for g in (0, 1):
        mine = [r for it, r in zip(items, roles) if it.gold == g]
        # 15 of 50 tested; of the other 35, round(10.5) = 10 test thresholds
        assert (mine.count("test"), mine.count("threshold"), mine.count("fit")) == (15, 10, 25)
    assert assign_roles(items, 0.3, 0.3, seed=2) == roles


def test_too_few_items_for_a_test_split_are_refused():
    with pytest.raises(ValueError, match="too few to hold out a test split"):
        fit_calibration([Labelled("noul", (0.6, 0.4), 0, 0.9)] * 1)


@pytest.mark.parametrize(
    ("masses", "floor"),
    [
        ([i / 100 for i in range(1, 101)], 0.01 + 0.05 * 99 * 0.01),
        ([0.99] * 20, 0.5),
        ([], 0.0),
        ([0.2, 0.4], 0.21),
    ],
)
def test_the_default_label_mass_floor(masses, floor):
    assert fit_label_mass_floor(masses) == pytest.approx(floor, **EXACT)


def test_answers_below_the_floor_are_left_out_of_the_threshold_and_counted_on_test():
    items = [Labelled("noul", (0.99, 0.01), 0, 0.9)] * 320 + [
        Labelled("noul", (0.99, 0.01), 1, 0.05)
    ] * 80  # confidently wrong, little label mass
    fit = fit_calibration(
        items, methods=["temperature"], seed=1, target_accuracy=0.9, label_mass_floor=0.1
    )
    # 67 answers of the 84 in the threshold split are above the floor, all right
    assert fit.threshold.threshold == 0.01 and fit.threshold.accuracy == 1.0
    assert fit.threshold.lower_bound == pytest.approx(0.05 ** (1 / 67), **EXACT)
    assert fit.threshold.coverage == pytest.approx(67 / 84, **EXACT)
    on_test = fit.threshold_on_test()
    assert (on_test["n"], on_test["below_floor"], on_test["count"]) == (120, 24, 96)
    assert on_test["below_floor_accuracy"] == 0.0 and on_test["accuracy"] == 1.0
    unfloored = fit_calibration(
        items, methods=["temperature"], seed=1, target_accuracy=0.9, label_mass_floor=0.0
    )
    assert unfloored.threshold.threshold is None  # 20% wrong at the top


@pytest.mark.parametrize("kwargs", [{"folds": 1}, {"methods": ["magic"]}])
def test_fit_calibration_refuses_bad_settings(kwargs):
    with pytest.raises(ValueError):
        fit_calibration([Labelled("noul", (0.5, 0.5), 0)] * 20, **kwargs)


def test_platt_is_for_noul_only():
    with pytest.raises(ValueError):
        fit_method("platt", "choice", [[0.6, 0.4]] * 3, [0, 1, 0])
    with pytest.raises(ValueError):
        apply_method("platt", {"a": 1.0, "b": 0.0}, "choice", [0.2, 0.3, 0.5])
