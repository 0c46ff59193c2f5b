"""How a question is laid out for the model.

The wording is pinned by ``PROMPT_FORMAT_VERSION`` and echoed in every answer,
so a probability can be reproduced. Change the wording, bump the version.

A chat request keeps the caller's conversation and gets the options block in one
of two layouts (``semif.layout``), each with its own ``PROMPT_FORMAT_VERSIONS``:

- ``conversation_first`` (semif-1): the options block appended to its last user
  message (or as a new user message when the conversation does not end with one);
- ``options_first`` (semif-3): the options block as a system turn before the
  conversation (the caller's own system text after it), and nothing after a
  conversation that ends with a user turn (one that ends otherwise gets
  ``ANSWER_INSTRUCTION`` as a user turn of its own). The fixed part of a classifier
  (its instructions and options) is then a prefix every request shares, which a
  llama-server slot keeps; the conversation is all that is new. (semif-2 put an answer
  cue, ``Label:``, after the last user message: three or four tokens more of every new
  conversation, about a one-token read's time here, for accuracy and ECE that the
  labelled sets could not tell apart; docs/performance.md.)

Either way the answer follows the last turn: what the chat template puts after a user
turn (end of turn, assistant header, an empty thinking block) is the *answer context* in
which labels are checked to be single tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .question import Question

__all__ = [
    "CONTENT_FREE",
    "content_free",
    "PROMPT_FORMAT_VERSION",
    "LAYOUTS",
    "DEFAULT_LAYOUT",
    "PROMPT_FORMAT_VERSIONS",
    "lay_out",
    "options_first",
    "ANSWER_INSTRUCTION",
    "options_block",
    "append_to_conversation",
    "answer_context",
    "STATE_HEADER",
    "state_messages",
    "RERANK_QUERY",
    "POINTWISE_INSTRUCTION",
    "LISTWISE_INSTRUCTION",
]

CONTENT_FREE = "N/A"  # the content-free input of contextual calibration (Zhao et al.)

PROMPT_FORMAT_VERSION = "semif-1"  # System One, Decisions, rerank and conversation_first
LAYOUTS = ("conversation_first", "options_first")
DEFAULT_LAYOUT = "conversation_first"  # chosen from bench/layouts.py (docs/performance.md)
PROMPT_FORMAT_VERSIONS = {"conversation_first": PROMPT_FORMAT_VERSION, "options_first": "semif-3"}
ANSWER_INSTRUCTION = "Answer with the label of the best option only."
STATE_HEADER = "Read the following and answer the question after it."
# rerank (protocol/rerank.py): the query is the state, read once; each document is asked
# about in its own question (pointwise), or all are options of one choice (listwise)
RERANK_QUERY = "Query:"
POINTWISE_INSTRUCTION = "Document:\n{document}\n\nDoes this document answer or match the query?"
LISTWISE_INSTRUCTION = "Which document answers or matches the query best?"

_HEADERS = {
    "choice": "Which option fits best?",
    "noul": "Is the answer yes or no?",
    "score": "Which level fits best? Levels run from lowest to highest.",
}


def options_block(question: Question, labels: Sequence[str]) -> str:
    """The question, one ``LABEL: option`` line per option, then the answer instruction."""
    if len(labels) != len(question.shown):
        raise ValueError("one label per option")
    header = question.instructions.strip() if question.instructions else _HEADERS[question.kind]
    lines = [f"{label}: {' '.join(shown.split())}" for label, shown in zip(labels, question.shown)]
    return "\n".join([header, "", "Options:", *lines, "", ANSWER_INSTRUCTION])


def append_to_conversation(messages: Sequence[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """A copy of ``messages`` with ``block`` after the last user turn's text.

    The caller's list and dicts are left untouched.
    """
    out = [dict(m) for m in messages]
    last = out[-1] if out else None
    if last is not None and last.get("role") == "user":
        content = last.get("content")
        if isinstance(content, str):
            last["content"] = f"{content}\n\n{block}" if content else block
            return out
        if isinstance(content, list):
            last["content"] = [*content, {"type": "text", "text": "\n\n" + block}]
            return out
    out.append({"role": "user", "content": block})
    return out


def options_first(messages: Sequence[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """A copy of ``messages`` with ``block`` as the first system turn (before the caller's
    own system text, in the same turn), and ``ANSWER_INSTRUCTION`` as a user turn after a
    conversation that does not end with one. The caller's list and dicts are left
    untouched."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{block}\n\n{out[0]['content']}" if out[0]["content"] else block
    else:
        out.insert(0, {"role": "system", "content": block})
    if out[-1].get("role") != "user":
        out.append({"role": "user", "content": ANSWER_INSTRUCTION})
    return out


def lay_out(messages: Sequence[dict[str, Any]], block: str, layout: str) -> list[dict[str, Any]]:
    """The conversation a question is read in, in ``layout`` (one of ``LAYOUTS``)."""
    if layout == "options_first":
        return options_first(messages, block)
    return append_to_conversation(messages, block)


def answer_context(rendered_prompt: str) -> str:
    """The text the chat template put after ``ANSWER_INSTRUCTION``: where the label goes."""
    at = rendered_prompt.rfind(ANSWER_INSTRUCTION)
    if at < 0:
        raise ValueError("the rendered prompt lost the answer instruction")
    return rendered_prompt[at + len(ANSWER_INSTRUCTION) :]


def content_free(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with its last user turn's content replaced by the content-free
    input "N/A" (contextual calibration; the last turn when no turn is the user's)."""
    out = [dict(m) for m in messages]
    users = [i for i, m in enumerate(out) if m.get("role") == "user"]
    at = users[-1] if users else len(out) - 1
    if at >= 0:
        out[at]["content"] = CONTENT_FREE
    return out


def state_messages(state_text: str) -> list[dict[str, Any]]:
    """The conversation a System One question is asked in: one user turn with the state.

    The question block is appended after it, so every question of a request
    shares the text up to the end of the state, which llama-server's prompt
    cache then computes once.
    """
    return [{"role": "user", "content": f"{STATE_HEADER}\n\n{state_text}"}]
