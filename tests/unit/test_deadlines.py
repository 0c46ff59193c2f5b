"""A request's deadline from its headers (proxy/deadlines.py): which header wins, the
maximum, the SDK timeout that only shortens, and the refusals, with exact values."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from proxy.deadlines import Deadline, request_deadline
from proxy.errors import InvalidHeader, system_one_error

OWN = "X-Semif-Deadline"
ATTRS = "X-Amzn-SageMaker-Custom-Attributes"
TS = "X-Stainless-Timeout"  # the TypeScript SDK's
PY = "X-Stainless-Read-Timeout"  # the Python SDK's
IN_ATTRS = f"semif-deadline in {ATTRS}"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, Deadline(50.0, 3600.0)),
        ({OWN: "300"}, Deadline(300.0, 3600.0, OWN)),
        ({OWN: " 2.5 "}, Deadline(2.5, 3600.0, OWN)),
        ({OWN: "1e3"}, Deadline(1000.0, 3600.0, OWN)),
        ({OWN: "7200"}, Deadline(3600.0, 3600.0, OWN, 7200.0)),  # cut to the maximum
        ({"x-semif-deadline": "10"}, Deadline(10.0, 3600.0, OWN)),  # any case
        ({ATTRS: "semif-deadline=300"}, Deadline(300.0, 3600.0, IN_ATTRS)),
        ({ATTRS: "trace=abc, semif-deadline=120; tenant=7"}, Deadline(120.0, 3600.0, IN_ATTRS)),
        ({ATTRS: "flag;Semif-Deadline = 90 ;x=1=2"}, Deadline(90.0, 3600.0, IN_ATTRS)),
        ({ATTRS: "trace=abc"}, Deadline(50.0, 3600.0)),  # none of ours: the server's
        ({ATTRS: "semif-deadline-x=5,deadline=5"}, Deadline(50.0, 3600.0)),
        ({ATTRS: "semif-deadline=9000"}, Deadline(3600.0, 3600.0, IN_ATTRS, 9000.0)),
        # the project's own header wins over the attribute
        ({OWN: "200", ATTRS: "semif-deadline=100"}, Deadline(200.0, 3600.0, OWN)),
        # an SDK's timeout shortens, never lengthens
        ({PY: "600"}, Deadline(50.0, 3600.0)),  # the Python SDK's default
        ({TS: "600"}, Deadline(50.0, 3600.0)),  # the TypeScript SDK's default
        ({PY: "30.0"}, Deadline(30.0, 3600.0, PY)),
        ({TS: "20"}, Deadline(20.0, 3600.0, TS)),
        ({OWN: "900", PY: "600"}, Deadline(600.0, 3600.0, PY)),
        ({OWN: "300", PY: "600"}, Deadline(300.0, 3600.0, OWN)),
        ({OWN: "7200", TS: "5000"}, Deadline(3600.0, 3600.0, OWN, 7200.0)),
        ({TS: "40", PY: "10"}, Deadline(10.0, 3600.0, PY)),
    ],
)
def test_the_deadline_a_request_asks_for(headers, expected):
    assert request_deadline(CIMultiDict(headers), 50.0, 3600.0) == expected


@pytest.mark.parametrize(
    ("headers", "param", "message"),
    [
        ({OWN: "soon"}, OWN, "X-Semif-Deadline must be a number of seconds above 0, not 'soon'"),
        ({OWN: "0"}, OWN, "X-Semif-Deadline must be a number of seconds above 0, not '0'"),
        ({OWN: "-5"}, OWN, "X-Semif-Deadline must be a number of seconds above 0, not '-5'"),
        ({OWN: "nan"}, OWN, "X-Semif-Deadline must be a number of seconds above 0, not 'nan'"),
        ({OWN: "inf"}, OWN, "X-Semif-Deadline must be a number of seconds above 0, not 'inf'"),
        ({OWN: ""}, OWN, "X-Semif-Deadline must be a number of seconds above 0, not ''"),
        (
            {ATTRS: "a=1,semif-deadline=later"},
            ATTRS,
            f"semif-deadline in {ATTRS} must be a number of seconds above 0, not 'later'",
        ),
        (
            {ATTRS: "semif-deadline=10;semif-deadline=20"},
            ATTRS,
            f"{ATTRS} names semif-deadline more than once",
        ),
        ({PY: "0"}, PY, f"{PY} must be a number of seconds above 0, not '0'"),
        ({TS: "10s"}, TS, f"{TS} must be a number of seconds above 0, not '10s'"),
        # a bad SDK timeout is refused even beside a good header of ours
        ({OWN: "30", TS: "x"}, TS, f"{TS} must be a number of seconds above 0, not 'x'"),
    ],
)
def test_a_bad_value_is_a_400_naming_its_header(headers, param, message):
    with pytest.raises(InvalidHeader) as caught:
        request_deadline(CIMultiDict(headers), 50.0, 3600.0)
    assert (caught.value.status, caught.value.code) == (400, "invalid_header")
    assert (caught.value.param, caught.value.message) == (param, message)


def test_system_one_names_the_header_in_its_422():
    err = InvalidHeader("X-Semif-Deadline must be a number of seconds above 0, not 'x'", OWN)
    reply = system_one_error(err)
    assert reply.status == 422
    assert reply.body == {
        "detail": [
            {
                "loc": ["header", "x-semif-deadline"],
                "msg": "X-Semif-Deadline must be a number of seconds above 0, not 'x'",
                "type": "invalid_header",
            }
        ]
    }


@pytest.mark.parametrize(
    ("deadline", "described", "longer"),
    [
        (
            Deadline(50.0, 3600.0),
            "the deadline is 50 s",
            "or send a longer X-Semif-Deadline (at most 3600 s)",
        ),
        (
            Deadline(50.0, 50.0),
            "the deadline is 50 s",
            "or start the proxy with a longer --decision-deadline-s",
        ),
        (
            Deadline(30.0, 3600.0, PY),
            "the deadline is 30 s (X-Stainless-Read-Timeout)",
            "or send a longer X-Semif-Deadline (at most 3600 s)",
        ),
        (
            Deadline(3600.0, 3600.0, OWN, 7200.0),
            "the deadline is 3600 s (X-Semif-Deadline asked for 7200 s; the server's maximum)",
            "or start the proxy with a longer --max-decision-deadline-s",
        ),
    ],
)
def test_how_a_refusal_names_the_deadline(deadline, described, longer):
    assert (deadline.describe(), deadline.longer()) == (described, longer)
