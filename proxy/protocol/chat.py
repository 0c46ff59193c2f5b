"""OpenAI ``chat.completion`` bodies carrying a decision."""

from __future__ import annotations

import random
import time
from typing import Any

from ..decision.prompt import PROMPT_FORMAT_VERSION
from ..decision.readout import system_one_answer
from ..decision.outcome import Outcome

__all__ = ["semif_object", "completion_body", "completion_chunk"]


def semif_object(outcome: Outcome) -> dict[str, Any]:
    """The answer in System One form plus the read's own facts."""
    decision = outcome.decision
    answer = system_one_answer(decision)
    if decision.question.kind == "noul":
        answer["probabilities"] = dict(zip(decision.question.names, decision.probabilities))
    answer["label_mass"] = decision.label_mass
    answer["labels"] = dict(zip(decision.question.names, outcome.labels))
    answer["reads"] = outcome.reads
    if outcome.calibration is not None:
        answer["calibration"] = outcome.calibration
        answer["route"] = outcome.route
        answer["route_reason"] = outcome.route_reason
    if outcome.debias is not None:
        answer["debias"] = outcome.debias
        if outcome.debias_note:
            answer["debias_note"] = outcome.debias_note
    answer["prompt_format_version"] = PROMPT_FORMAT_VERSION
    return answer


def _usage(outcome: Outcome) -> dict[str, int]:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": 1,
        "total_tokens": outcome.prompt_tokens + 1,
    }


def completion_body(outcome: Outcome, model: str | None) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-semif-{random.getrandbits(128):032x}",  # unique, not secret
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or outcome.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": outcome.decision.best_name},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(outcome),
        "semif": semif_object(outcome),
    }


def completion_chunk(outcome: Outcome, model: str | None) -> dict[str, Any]:
    """The whole answer as one ``chat.completion.chunk`` (the stream then ends)."""
    body = completion_body(outcome, model)
    choice = body["choices"][0]
    body["object"] = "chat.completion.chunk"
    body["choices"] = [
        {
            "index": 0,
            "delta": choice["message"],
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    return body
