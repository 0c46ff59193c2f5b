"""Properties of the readout and the protocol parsers, over generated input.

Readout: every distribution sums to 1 within 1e-9, is finite, keeps one value
per option in option order; a temperature never moves the most likely option;
confidences stay in [0, 1]. Parsers: any JSON-like body either becomes a valid
question or is refused with our own ``InvalidRequest`` (``Unprocessable`` for
System One), never another exception.

Log-probabilities are generated as llama-server reports them: the float32
logarithms of a sub-distribution (at most one label above log 0.5); two more
properties hold for any log-probabilities and any positive temperature (they
found the overflow of a subnormal temperature and an argmax moved by rounding).
"""

from __future__ import annotations

import math
import struct
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.decision.question import (
    MAX_LEVELS,
    MAX_OPTIONS,
    MIN_OPTIONS,
    NOUL_NAMES,
    Question,
    choice_question,
    noul_question,
    score_question,
)
from proxy.decision.readout import (
    choice_confidence,
    decide,
    normalise,
    score_confidence,
    system_one_answer,
)
from proxy.errors import InvalidRequest, Unprocessable
from proxy.protocol import decisions, systemone
from proxy.protocol.semif import parse_chat

PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, database=None)
TEMPERATURES = st.floats(min_value=1e-2, max_value=1e2)

# -- generated input ---------------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


NAME = st.text(min_size=1, max_size=6)
DESCRIPTION = st.none() | st.text(max_size=8) | JSON


def _bodies(build: Any) -> st.SearchStrategy:
    """Well-formed bodies (valid or refused for their meaning), the same with any JSON
    in place of some fields, and any JSON at all."""
    return st.one_of(build(lambda s: s), build(lambda s: s | JSON), JSON)


def _semif(f: Any) -> st.SearchStrategy:
    options = f(
        st.one_of(
            st.lists(NAME, min_size=2, max_size=12),
            st.dictionaries(NAME, DESCRIPTION, min_size=2, max_size=12),
            st.none()
            | st.fixed_dictionaries({}, optional={"true": DESCRIPTION, "false": DESCRIPTION}),
            st.lists(NAME | st.dictionaries(NAME, SCALARS, max_size=2), min_size=2, max_size=10),
        )
    )
    return f(
        st.fixed_dictionaries(
            {"options": options},
            optional={
                "type": f(st.sampled_from(["choice", "noul", "score"])),
                "temperature": f(st.floats(1e-3, 1e3)),
                "debias": f(st.none() | st.just("cyclic")),
                "calibration": f(st.none() | NAME),
            },
        )
    ), options


def _system_one(f: Any) -> st.SearchStrategy:
    _, criteria = _semif(f)
    question = f(
        st.fixed_dictionaries(
            {"type": f(st.sampled_from(["choice", "noul", "score"])), "criteria": criteria},
            optional={"instructions": DESCRIPTION},
        )
    )
    return f(
        st.fixed_dictionaries(
            {
                "state": f(st.text(max_size=12) | JSON),
                "questions": f(
                    st.dictionaries(st.text(max_size=4), question, min_size=1, max_size=4)
                ),
            },
            optional={"model": f(st.none() | NAME), "ignored": JSON},
        )
    )


def _decisions(f: Any) -> st.SearchStrategy:
    part = st.fixed_dictionaries(
        {"type": st.sampled_from(["input_text", "input_image"]), "text": NAME}
    )
    text = f(st.text(min_size=1, max_size=8) | st.lists(part, min_size=1, max_size=2))
    choices = st.lists(
        st.fixed_dictionaries(
            {"value": NAME | st.booleans()}, optional={"description": st.none() | NAME}
        ),
        min_size=2,
        max_size=8,
    )
    question = f(
        st.one_of(
            st.fixed_dictionaries({"type": st.just("predicate"), "instructions": text}),
            st.fixed_dictionaries(
                {"type": st.just("choice"), "instructions": text, "choices": f(choices)}
            ),
            st.fixed_dictionaries(
                {
                    "type": st.just("score"),
                    "instructions": text,
                    "levels": f(
                        st.lists(st.fixed_dictionaries({"label": NAME}), min_size=2, max_size=10)
                    ),
                }
            ),
        )
    )
    item = f(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "developer", "system", "assistant"]),
                "content": st.text(max_size=8),
            },
            optional={"type": f(st.just("message"))},
        )
    )
    return f(
        st.fixed_dictionaries(
            {
                "model": f(NAME),
                "input": f(st.text(max_size=8) | st.lists(item, min_size=1, max_size=3)),
                "questions": f(st.lists(question, min_size=1, max_size=3)),
            }
        )
    )


SEMIF = _bodies(lambda f: _semif(f)[0])
S1_BODY = _bodies(_system_one)
D_BODY = _bodies(_decisions)


@st.composite
def label_logprobs(draw: st.DrawFn, n: int) -> list[float]:
    """float32 log-probabilities of n labels whose probabilities sum to at most 1."""
    weights = draw(st.lists(st.floats(1e-30, 1.0), min_size=n, max_size=n))
    mass = draw(st.floats(1e-30, 1.0))
    total = math.fsum(weights)
    return [_float32(math.log(mass * w / total)) for w in weights]


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


@st.composite
def questions(draw: st.DrawFn, temperature: float = 1.0) -> Question:
    kind = draw(st.sampled_from(["choice", "noul", "score"]))
    if kind == "noul":
        return noul_question(None, temperature=temperature)
    n = draw(st.integers(2, MAX_LEVELS if kind == "score" else MAX_OPTIONS))
    if kind == "score":
        return score_question([f"level {i}" for i in range(n)], temperature=temperature)
    return choice_question([f"option {i}" for i in range(n)], temperature=temperature)


# -- readout ------------------------------------------------------------------------------------


def _assert_distribution(probs: Any, n: int) -> None:
    assert len(probs) == n
    assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in probs)
    assert abs(math.fsum(probs) - 1.0) <= 1e-9
    assert abs(sum(probs) - 1.0) <= 1e-9


@PROPERTY
@given(st.data(), TEMPERATURES)
def test_normalise_gives_a_distribution(data: st.DataObject, temperature: float) -> None:
    n = data.draw(st.integers(1, MAX_OPTIONS))
    _assert_distribution(normalise(data.draw(label_logprobs(n)), temperature), n)


@PROPERTY
@given(st.data(), questions())
def test_decide_keeps_the_options_and_their_order(data: st.DataObject, question: Question) -> None:
    decision = decide(question, data.draw(label_logprobs(len(question.names))))
    _assert_distribution(decision.probabilities, len(question.names))
    assert decision.probabilities[decision.best] == max(decision.probabilities)
    answer = system_one_answer(decision)
    if question.kind == "noul":
        assert answer["noul"] == decision.probabilities[NOUL_NAMES.index("true")]
    else:
        assert list(answer["probabilities"]) == list(question.names)
        assert list(answer["probabilities"].values()) == list(decision.probabilities)
        assert 0.0 <= answer["confidence"] <= 1.0
    if question.kind == "score":
        assert list(answer["legend"]) == list(question.names)
        assert 0.0 <= answer["score"] <= len(question.names) - 1 + 1e-9


def _assert_order_kept(logprobs: list[float], decision) -> None:
    """What a caller reads at any temperature: the named choice has the largest returned
    probability, a unique largest probability is the most likely label's, and a more
    likely label never gets a smaller probability."""
    probs = decision.probabilities
    assert probs[decision.best] == max(probs)
    top = [i for i, p in enumerate(probs) if p == max(probs)]
    if len(top) == 1:
        assert top[0] == decision.best == logprobs.index(max(logprobs))
    for i, li in enumerate(logprobs):
        for j, lj in enumerate(logprobs):
            if li > lj:
                assert probs[i] >= probs[j], (i, j)


@PROPERTY
@given(st.data(), TEMPERATURES)
def test_at_any_temperature_the_returned_probabilities_name_the_choice(
    data: st.DataObject, t: float
) -> None:
    n = data.draw(st.integers(2, MAX_OPTIONS))
    logprobs = data.draw(label_logprobs(n))
    at_t = decide(choice_question([f"o{i}" for i in range(n)], temperature=t), logprobs)
    _assert_order_kept(logprobs, at_t)


@PROPERTY
@given(st.data(), TEMPERATURES)
def test_confidences_stay_within_0_and_1(data: st.DataObject, temperature: float) -> None:
    n = data.draw(st.integers(2, MAX_LEVELS))
    probs = normalise(data.draw(label_logprobs(n)), temperature)
    assert 0.0 <= choice_confidence(probs) <= 1.0
    assert 0.0 <= score_confidence(probs) <= 1.0


@PROPERTY
@given(
    st.lists(st.floats(-1e4, -1e-3), min_size=2, max_size=8),
    st.floats(min_value=0.0, exclude_min=True, allow_infinity=False),
)
@example([-1.0, -2.0], 5e-324)
def test_any_positive_finite_temperature_gives_a_distribution(logprobs: list[float], t: float):
    _assert_distribution(normalise(logprobs, t), len(logprobs))


@PROPERTY
@given(st.lists(st.floats(-1.0, 0.0), min_size=2, max_size=4), TEMPERATURES)
@example([-1e-17, 0.0], 1e-3)
@example([-3.0, -0.1], 1e300)  # the probabilities round to a tie: the choice is still one
def test_close_log_probabilities_keep_their_order_at_any_temperature(logprobs, t) -> None:
    names = [f"o{i}" for i in range(len(logprobs))]
    _assert_order_kept(logprobs, decide(choice_question(names, temperature=t), logprobs))


# -- parsers ------------------------------------------------------------------------------------


def _assert_valid_question(q: Question) -> None:
    assert q.kind in ("choice", "noul", "score")
    assert math.isfinite(q.temperature) and q.temperature > 0
    assert len(q.shown) == len(q.names)
    assert all(isinstance(name, str) and name.strip() for name in q.names)
    assert len({name.strip().casefold() for name in q.names}) == len(q.names)
    if q.kind == "noul":
        assert q.names == NOUL_NAMES
    elif q.kind == "score":
        assert q.names == tuple(str(i) for i in range(len(q.names)))
        assert 2 <= len(q.names) <= MAX_LEVELS and len(q.legend or ()) == len(q.names)
    else:
        assert MIN_OPTIONS <= len(q.names) <= MAX_OPTIONS


@PROPERTY
@given(SEMIF)
def test_parse_semif_gives_a_valid_question_or_invalid_request(raw: Any) -> None:
    try:
        call = parse_chat({"messages": [{"role": "user", "content": "hi"}], "semif": raw}).call
    except InvalidRequest as err:
        assert type(err) is InvalidRequest and err.param and err.param.startswith("semif")
        return
    _assert_valid_question(call.question)
    options = raw.get("options")
    if call.question.kind == "choice":
        assert list(call.question.names) == list(options)  # list order or key order


@PROPERTY
@given(S1_BODY)
def test_system_one_parse_request_gives_valid_questions_or_unprocessable(body: Any) -> None:
    try:
        call = systemone.parse_request(body)
    except Unprocessable as err:
        assert err.details and all(d["loc"][0] == "body" for d in err.details)
        return
    assert list(call.questions) == list(body["questions"])
    assert isinstance(call.state_text, str)
    for question in call.questions.values():
        _assert_valid_question(question)


@PROPERTY
@given(D_BODY)
def test_decisions_parse_request_gives_valid_questions_or_invalid_request(body: Any) -> None:
    try:
        call = decisions.parse_request(body)
    except InvalidRequest as err:
        assert type(err) is InvalidRequest
        return
    assert len(call.asked) == len(body["questions"])
    for asked in call.asked:
        _assert_valid_question(asked.question)
