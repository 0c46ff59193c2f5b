import pytest

from proxy.decision.prompt import (
    ANSWER_INSTRUCTION,
    answer_context,
    append_to_conversation,
    options_block,
)
from proxy.decision.question import choice_question, noul_question, score_question


def test_choice_block_layout():
    q = choice_question({"billing": "charges and refunds", " shipping ": None})
    assert options_block(q, ["A", "B"]) == (
        "Which option fits best?\n\nOptions:\nA: billing - charges and refunds\nB: shipping\n\n"
        + ANSWER_INSTRUCTION
    )


def test_noul_and_score_blocks():
    noul = options_block(noul_question({"true": "it is spam"}), ["A", "B"])
    assert "A: yes - it is spam\nB: no\n" in noul
    score = options_block(score_question(["calm", "line\nbreak  inside"]), ["A", "B"])
    assert "lowest to highest" in score
    assert "A: calm\nB: line break inside\n" in score  # one line per option, always


def test_instructions_replace_the_header():
    q = choice_question(["x", "y"], instructions="  Which team owns it?  ")
    assert options_block(q, ["A", "B"]).startswith("Which team owns it?\n\nOptions:\n")


def test_block_needs_one_label_per_option():
    with pytest.raises(ValueError):
        options_block(choice_question(["x", "y"]), ["A"])


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (
            [{"role": "user", "content": "hi"}],
            [{"role": "user", "content": "hi\n\nBLOCK"}],
        ),
        (
            [{"role": "user", "content": ""}],
            [{"role": "user", "content": "BLOCK"}],
        ),
        (
            [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}],
            [
                {"role": "system", "content": "s"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "BLOCK"},
            ],
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "text", "text": "\n\nBLOCK"},
                    ],
                }
            ],
        ),
    ],
)
def test_append_to_conversation(messages, expected):
    before = [dict(m) for m in messages]
    assert append_to_conversation(messages, "BLOCK") == expected
    assert messages == before  # the caller's conversation is untouched


def test_answer_context_is_what_follows_the_last_instruction():
    prompt = f"x {ANSWER_INSTRUCTION} y {ANSWER_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    assert answer_context(prompt) == "<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError):
        answer_context("no instruction here")


from proxy.decision.prompt import (  # noqa: E402
    PROMPT_FORMAT_VERSIONS,
    lay_out,
    options_first,
)

BLOCK = "Which team?\n\nOptions:\nA: billing\nB: shipping\n\n" + ANSWER_INSTRUCTION


@pytest.mark.parametrize(
    "messages, expected",
    [
        (
            [{"role": "user", "content": "I was charged twice."}],
            [
                {"role": "system", "content": BLOCK},
                {"role": "user", "content": "I was charged twice."},  # nothing after it
            ],
        ),
        # the caller's system text follows ours, in the same turn
        (
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            [
                {"role": "system", "content": BLOCK + "\n\nBe brief."},
                {"role": "user", "content": "Hi"},
            ],
        ),
        # a conversation that does not end with the user: the instruction as a user turn
        (
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
            [
                {"role": "system", "content": BLOCK},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": ANSWER_INSTRUCTION},
            ],
        ),
    ],
)
def test_options_first_puts_the_fixed_part_in_front(messages, expected):
    before = [dict(m) for m in messages]
    assert options_first(messages, BLOCK) == expected
    assert messages == before  # the caller's conversation is left untouched


def test_each_layout_has_its_own_prompt_format_version():
    convo = [{"role": "user", "content": "Hi"}]
    assert lay_out(convo, BLOCK, "conversation_first") == append_to_conversation(convo, BLOCK)
    assert lay_out(convo, BLOCK, "options_first") == options_first(convo, BLOCK)
    assert PROMPT_FORMAT_VERSIONS == {"conversation_first": "semif-1", "options_first": "semif-3"}
