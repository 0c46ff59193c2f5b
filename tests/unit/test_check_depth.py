"""The nesting limit on decision bodies, with and without the bracket count shortcut."""

import orjson
import pytest

from proxy.errors import InvalidRequest
from proxy.routes.common import MAX_DEPTH, check_depth


def nested(depth: int) -> object:
    value: object = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (nested(MAX_DEPTH), True),
        (nested(MAX_DEPTH + 1), False),
        ({"text": "[" * 500 + "{" * 500, "list": [1, 2, 3]}, True),  # brackets in strings: walked
        ({"wide": [[1]] * 200}, True),  # many brackets, shallow
        ({"a": [{"b": nested(MAX_DEPTH - 2)}]}, False),
        ("plain", True),
    ],
)
@pytest.mark.parametrize("with_raw", [True, False])
def test_depth_limit(value, ok, with_raw):
    raw = orjson.dumps(value) if with_raw else None
    if ok:
        check_depth(value, raw)
    else:
        with pytest.raises(InvalidRequest, match=f"deeper than {MAX_DEPTH}"):
            check_depth(value, raw)
