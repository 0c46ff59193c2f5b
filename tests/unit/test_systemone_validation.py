import pytest

from proxy.errors import Unprocessable
from proxy.protocol.systemone import MAX_QUESTIONS, parse_request

CHOICE = {"type": "choice", "criteria": {"a": None, "b": "bee"}}


def _locs(body):
    with pytest.raises(Unprocessable) as caught:
        parse_request(body)
    assert caught.value.status == 422
    for entry in caught.value.details:
        assert set(entry) == {"loc", "msg", "type"} and entry["msg"]
    return [entry["loc"] for entry in caught.value.details]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"questions": {"q": CHOICE}}, ["body", "state"]),
        ({"state": None, "questions": {"q": CHOICE}}, ["body", "state"]),
        ({"state": 42, "questions": {"q": CHOICE}}, ["body", "state"]),
        ({"state": "s"}, ["body", "questions"]),
        ({"state": "s", "questions": {}}, ["body", "questions"]),
        ({"state": "s", "questions": []}, ["body", "questions"]),
        ({"state": "s", "questions": {"q": {"criteria": {"a": None}}}}, ["body", "questions", "q"]),
        ({"state": "s", "questions": {"q": {"type": "box"}}}, ["body", "questions", "q"]),
        (
            {"state": "s", "questions": {"q": {"type": "choice", "criteria": {}}}},
            ["body", "questions", "q", "choice", "criteria"],
        ),
        (
            {"state": "s", "questions": {"q": {"type": "choice", "criteria": {"one": None}}}},
            ["body", "questions", "q", "choice", "criteria"],
        ),
        (
            {
                "state": "s",
                "questions": {
                    "q": {"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}
                },
            },
            ["body", "questions", "q", "choice", "criteria"],
        ),
        (
            {"state": "s", "questions": {"q": {"type": "score", "criteria": ["only"]}}},
            ["body", "questions", "q", "score", "criteria"],
        ),
        (
            {
                "state": "s",
                "questions": {"q": {"type": "score", "criteria": [str(i) for i in range(11)]}},
            },
            ["body", "questions", "q", "score", "criteria"],
        ),
        (
            {
                "state": "s",
                "questions": {"q": {"type": "score", "criteria": {"low": 0, "high": 1}}},
            },
            ["body", "questions", "q", "score", "criteria"],
        ),
        (
            {"state": "s", "questions": {"q": {"type": "score", "criteria": ["low", None]}}},
            ["body", "questions", "q", "score", "criteria", 1],
        ),
        (
            {"state": "s", "questions": {"q": {"type": "noul", "criteria": {"maybe": "x"}}}},
            ["body", "questions", "q", "noul", "criteria"],
        ),
        (
            {"state": "s", "questions": {str(i): CHOICE for i in range(MAX_QUESTIONS + 1)}},
            ["body", "questions"],
        ),
        ({"state": "s", "model": 3, "questions": {"q": CHOICE}}, ["body", "model"]),
    ],
)
def test_invalid_requests_name_the_field(body, loc):
    assert loc in _locs(body)


def test_every_bad_question_is_reported():
    body = {
        "state": "s",
        "questions": {
            "a": {"type": "choice", "criteria": {"x": None}},
            "b": {"type": "score", "criteria": ["one"]},
            "c": CHOICE,
        },
    }
    assert _locs(body) == [
        ["body", "questions", "a", "choice", "criteria"],
        ["body", "questions", "b", "score", "criteria"],
    ]


def test_valid_request_keeps_ids_names_and_structured_text():
    body = {
        "model": "jev-latest",
        "state": {"subject": "Duplicate charge", "body": "Charged twice 💳"},
        "unknown_field": "ignored",
        "questions": {
            "route it 🚦": {
                "type": "choice",
                "instructions": {"task": "route"},
                "criteria": {" Billing ": ["money", "refunds"], "🚚 shipping": None},
            },
            "urgency": {"type": "score", "criteria": ["low", {"level": "high"}]},
            "spam": {"type": "noul", "criteria": {"true": "advertising"}},
            "plain": {"type": "noul", "criteria": None},
        },
    }
    call = parse_request(body)
    assert call.model == "jev-latest"
    assert call.state_text == '{"subject": "Duplicate charge", "body": "Charged twice 💳"}'
    assert list(call.questions) == ["route it 🚦", "urgency", "spam", "plain"]
    route = call.questions["route it 🚦"]
    assert route.names == (" Billing ", "🚚 shipping")
    assert route.shown == ('Billing - ["money", "refunds"]', "🚚 shipping")
    assert route.instructions == '{"task": "route"}'
    assert call.questions["urgency"].legend == ("low", {"level": "high"})


@pytest.mark.parametrize(
    ("x_debias", "expected"),
    [
        (None, {}),
        ("cyclic", {"c": (0, 1, 2), "n": (0, 1)}),  # the score question is read once
        ({"method": "cyclic", "rotations": 2}, {"c": (0, 1), "n": (0, 1)}),
    ],
)
def test_x_debias_applies_to_choice_and_noul(x_debias, expected):
    body = {
        "state": "s",
        "x_debias": x_debias,
        "questions": {
            "c": {"type": "choice", "criteria": {"a": None, "b": None, "d": None}},
            "s": {"type": "score", "criteria": ["low", "mid", "high"]},
            "n": {"type": "noul"},
        },
    }
    assert parse_request(body).debias == expected


@pytest.mark.parametrize("x_debias", ["shuffle", {"method": "cyclic", "rotations": 9}])
def test_bad_x_debias_is_422(x_debias):
    body = {"state": "s", "x_debias": x_debias, "questions": {"c": CHOICE}}
    assert ["body", "x_debias"] in _locs(body)
