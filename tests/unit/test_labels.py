import pytest

from proxy.decision.labels import (
    CANDIDATES,
    LabelError,
    assign_labels,
    gbnf_alternatives,
    single_token_id,
)


@pytest.mark.parametrize(
    ("context", "with_label", "expected"),
    [
        ([2, 198, 1, 520], [2, 198, 1, 520, 49], 49),  # one token appended
        ([2, 198], [2, 198, 49, 50], None),  # two tokens
        ([2, 198], [2, 330], None),  # merged with the context's last token
        ([], [49], 49),
        ([5], [5], None),  # nothing appended
    ],
)
def test_single_token_id(context, with_label, expected):
    assert single_token_id(context, with_label) == expected


def test_candidates_start_with_letters_and_are_unique():
    assert CANDIDATES[:3] == ("A", "B", "C")
    assert CANDIDATES[26:28] == ("AA", "AB")
    assert len(set(CANDIDATES)) == len(CANDIDATES) >= 255


def test_assign_labels_skips_multi_token_and_duplicate_ids():
    ids = {"A": 49, "B": None, "C": 51, "D": 49, "E": 53}
    assert assign_labels(3, ids) == [("A", 49), ("C", 51), ("E", 53)]


def test_assign_labels_follows_candidate_order_not_mapping_order():
    ids = {"C": 3, "B": 2, "A": 1}
    assert assign_labels(2, ids) == [("A", 1), ("B", 2)]


def test_assign_labels_refuses_when_too_few():
    with pytest.raises(LabelError, match="only 2"):
        assign_labels(3, {"A": 1, "B": 2, "C": None})


def test_grammar_lists_exactly_the_labels():
    assert gbnf_alternatives(["A", "B", "AA"]) == 'root ::= "A" | "B" | "AA"'


@pytest.mark.parametrize("labels", [[], ['"'], ["A B"], ["é"]])
def test_grammar_refuses_unsafe_labels(labels):
    with pytest.raises(LabelError):
        gbnf_alternatives(labels)
