import math

import pytest

from proxy.decision.debias import (
    DebiasError,
    average,
    divide_out,
    parse_debias,
    position_prior,
    question_prior,
    rotate,
    shifts,
)
from proxy.decision.prompt import content_free
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


EXACT = {"rel": 1e-12, "abs": 1e-15}


@pytest.mark.parametrize(
    ("spec", "n", "expected"),
    [
        (None, 3, (None, [])),
        ("cyclic", 3, ("cyclic", [0, 1, 2])),
        ({"method": "cyclic", "rotations": 2}, 4, ("cyclic", [0, 2])),
        ("pride", 3, ("pride", [])),
        ("contextual", 2, ("contextual", [])),
    ],
)
def test_parse_debias(spec, n, expected):
    assert parse_debias(spec, n) == expected


@pytest.mark.parametrize("spec", ["PriDe", {"method": "pride"}, 3, {"method": "cyclic", "k": 2}])
def test_parse_debias_refuses_what_it_does_not_know(spec):
    with pytest.raises(DebiasError):
        parse_debias(spec, 3)


def test_divide_out_is_the_normalised_ratio():
    q = choice_question(["a", "b", "c"])
    d = decide(q, [ln(0.5), ln(0.3), ln(0.2)])
    out = divide_out(d, (0.5, 0.25, 0.25))
    # (1, 1.2, 0.8) / 3
    assert out.probabilities == pytest.approx((1 / 3, 0.4, 0.8 / 3), **EXACT)
    assert out.best_name == "b" and out.label_mass == d.label_mass
    with pytest.raises(ValueError):
        divide_out(d, (0.5, 0.5, 0.0))


def test_question_prior_is_the_softmax_of_mean_log_probabilities_per_position():
    # a model that always gives position A twice position B's weight, whatever the option
    reads = [(2 / 3, 1 / 3), (2 / 3, 1 / 3)]
    assert question_prior(reads) == pytest.approx([2 / 3, 1 / 3], **EXACT)
    # option x strong (0.9 shown first, 0.6 shown second): the option's merit cancels out
    reads = [(0.9, 0.1), (0.4, 0.6)]  # shift 0: (x, y); shift 1: (y, x)
    a, b = (ln(0.9) + ln(0.4)) / 2, (ln(0.1) + ln(0.6)) / 2
    expected = [
        math.exp(a) / (math.exp(a) + math.exp(b)),
        math.exp(b) / (math.exp(a) + math.exp(b)),
    ]
    assert question_prior(reads) == pytest.approx(expected, **EXACT)
    assert expected[0] == pytest.approx(0.6 / (0.6 + math.sqrt(0.06)), **EXACT)


def test_position_prior_averages_the_questions_priors():
    one = [(0.5, 0.5), (0.5, 0.5)]  # no preference: (0.5, 0.5)
    two = [(0.8, 0.2), (0.8, 0.2)]  # (0.8, 0.2)
    assert position_prior([one, two]) == pytest.approx([0.65, 0.35], **EXACT)
    with pytest.raises(ValueError):
        position_prior([one, [(0.2, 0.3, 0.5)]])


def test_a_prior_estimated_from_rotations_undoes_the_preference_it_measured():
    # the model: P(option at position i) proportional to merit(option) * bias(i)
    bias, merit = (0.5, 0.3, 0.2), {"a": 1.0, "b": 3.0, "c": 2.0}
    q = choice_question(list(merit))

    def read(shift):
        shown = [q.names[(shift + i) % 3] for i in range(3)]
        w = [merit[name] * bias[i] for i, name in enumerate(shown)]
        return [x / sum(w) for x in w]

    prior = position_prior([[read(s) for s in range(3)]])
    assert prior == pytest.approx(bias, **EXACT)
    plain = decide(q, [ln(p) for p in read(0)])
    assert divide_out(plain, prior).probabilities == pytest.approx((1 / 6, 1 / 2, 1 / 3), **EXACT)


def test_the_content_free_conversation_replaces_the_last_user_turn():
    convo = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
    ]
    assert content_free(convo) == [*convo[:3], {"role": "user", "content": "N/A"}]
    assert convo[3]["content"] == [{"type": "text", "text": "x"}]  # the request is not touched
    assert content_free([{"role": "system", "content": "s"}]) == [
        {"role": "system", "content": "N/A"}
    ]
